// PNG through libpng and JPEG through libjpeg, so corrupt files fail with the decoder's own reason.
#include "datasets/image_io.h"

#include <jpeglib.h>
#include <png.h>

#include <charconv>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/input_file.h"
#include "datasets/image_limits.h"
#include "kernels/error.h"

namespace qeval::datasets {

std::string Image::color_type() const {
  if (color_channels() == 1) return has_alpha ? "gray+alpha" : "gray";
  return has_alpha ? "rgba" : "rgb";
}

namespace {

// Decoded interleaved samples; filled by the C-style decoders below.
struct Raw {
  int width = 0, height = 0, channels = 0, bit_depth = 8;
  bool has_alpha = false;
  std::vector<std::uint8_t> bytes;  // 8-bit samples, or 16-bit samples in host order
  std::uint64_t max_pixels = 0;     // checked against the header before anything is allocated
  bool too_large = false;           // error[] says by how much
  char error[256] = {};
};

// Sets out->error when width x height exceeds out->max_pixels; the decoders call it right after
// reading the header, before any buffer of the image's size exists.
bool exceeds_pixel_limit(Raw* out, std::uint64_t width, std::uint64_t height) {
  if (width * height <= out->max_pixels) return false;
  out->too_large = true;
  std::snprintf(out->error, sizeof out->error,
                "the image is %llux%llu = %llu pixels, more than the limit of %llu (%s raises it)",
                static_cast<unsigned long long>(width), static_cast<unsigned long long>(height),
                static_cast<unsigned long long>(width * height), static_cast<unsigned long long>(out->max_pixels),
                kMaxPixelsVariable);
  return true;
}

// ---- PNG -------------------------------------------------------------------------------------
// The setjmp/longjmp frames below hold no C++ objects with destructors: libpng errors jump back
// over C frames only.
struct PngReadState {
  const std::uint8_t* data;
  std::size_t size, pos;
  Raw* out;
  std::jmp_buf jump;
};

void png_error_fn(png_structp png, png_const_charp message) {
  auto* st = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(st->out->error, sizeof st->out->error, "%s", message);
  std::longjmp(st->jump, 1);
}
void png_warning_fn(png_structp, png_const_charp) {}  // warnings (e.g. unknown chunks) are benign

void png_read_fn(png_structp png, png_bytep dst, png_size_t n) {
  auto* st = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (st->size - st->pos < n) png_error(png, "file is truncated (read past the end of the data)");
  std::memcpy(dst, st->data + st->pos, n);
  st->pos += n;
}

// Returns false with out->error set. Row pointers live in out->bytes' storage.
bool decode_png_c(PngReadState* st, std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, st, png_error_fn, png_warning_fn);
  if (!png) {
    std::snprintf(st->out->error, sizeof st->out->error, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (setjmp(st->jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (!info) png_error(png, "out of memory");
  png_set_read_fn(png, st, png_read_fn);
  png_set_user_limits(png, 1u << 15, 1u << 15);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, color = 0;
  png_get_IHDR(png, info, &width, &height, &depth, &color, nullptr, nullptr, nullptr);
  if (exceeds_pixel_limit(st->out, width, height)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_expand(png);  // palette -> RGB, gray < 8 bit -> 8 bit, tRNS -> alpha
  if (depth == 16) png_set_swap(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  Raw* out = st->out;
  out->width = static_cast<int>(width);
  out->height = static_cast<int>(height);
  out->channels = png_get_channels(png, info);
  out->bit_depth = png_get_bit_depth(png, info);
  out->has_alpha = out->channels == 2 || out->channels == 4;
  const std::size_t stride = png_get_rowbytes(png, info);
  out->bytes.resize(stride * height);
  rows->resize(height);
  for (png_uint_32 i = 0; i < height; ++i) (*rows)[i] = out->bytes.data() + i * stride;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// ---- JPEG ------------------------------------------------------------------------------------
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  Raw* out;
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  char msg[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, msg);
  std::snprintf(err->out->error, sizeof err->out->error, "%s", msg);
  std::longjmp(err->jump, 1);
}

// libjpeg reports corrupt data as warnings (level -1) and goes on with grey blocks; a silently
// patched image must not be scored, so the first warning becomes the error.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (err->out->error[0] == 0) {
    char msg[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, msg);
    std::snprintf(err->out->error, sizeof err->out->error, "corrupt JPEG data: %s", msg);
  }
  cinfo->err->num_warnings++;
}

bool decode_jpeg_c(const std::uint8_t* data, std::size_t size, JpegError* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_error_exit;
  err->mgr.emit_message = jpeg_emit_message;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (exceeds_pixel_limit(err->out, cinfo.image_width, cinfo.image_height)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (cinfo.jpeg_color_space != JCS_GRAYSCALE) cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  Raw* out = err->out;
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  out->channels = cinfo.output_components;
  out->bit_depth = 8;
  const std::size_t stride = std::size_t(out->width) * out->channels;
  out->bytes.resize(stride * out->height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->bytes.data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out->error[0] == 0;
}

Image to_planes(const Raw& raw, const char* format) {
  Image img;
  img.bit_depth = raw.bit_depth;
  img.has_alpha = raw.has_alpha;
  img.format = format;
  const int c = raw.channels, h = raw.height, w = raw.width;
  img.planes = Tensor(DType::kFloat32, {c, h, w});
  float* dst = img.planes.data<float>();
  const std::size_t plane = std::size_t(h) * w;
  if (raw.bit_depth == 16) {
    const auto* src = reinterpret_cast<const std::uint16_t*>(raw.bytes.data());
    for (std::size_t p = 0; p < plane; ++p)
      for (int k = 0; k < c; ++k) dst[k * plane + p] = src[p * c + k];
  } else {
    const std::uint8_t* src = raw.bytes.data();
    for (std::size_t p = 0; p < plane; ++p)
      for (int k = 0; k < c; ++k) dst[k * plane + p] = src[p * c + k];
  }
  return img;
}

}  // namespace

std::uint64_t max_image_pixels() {
  const char* v = std::getenv(kMaxPixelsVariable);
  if (v == nullptr || *v == '\0') return kDefaultMaxPixels;
  const std::string_view text(v);
  std::uint64_t n = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || ptr != text.data() + text.size() || n == 0)
    throw InputError(std::string(kMaxPixelsVariable) + "='" + std::string(text) +
                     "': expected a positive whole number of pixels per image (default " +
                     std::to_string(kDefaultMaxPixels) + ")");
  return n;
}

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name) {
  return decode_image(bytes, name, max_image_pixels());
}

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name, std::uint64_t max_pixels) {
  static const std::uint8_t kPngSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.empty()) throw InputError(name + ": file is empty");
  Raw raw;
  raw.max_pixels = max_pixels;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSig, 8) == 0) {
    PngReadState st{bytes.data(), bytes.size(), 0, &raw, {}};
    std::vector<png_bytep> rows;
    if (!decode_png_c(&st, &rows))
      throw InputError(name + (raw.too_large ? ": PNG too large: " : ": corrupt PNG: ") + raw.error);
    return to_planes(raw, "png");
  }
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    JpegError err{};
    err.out = &raw;
    if (!decode_jpeg_c(bytes.data(), bytes.size(), &err))
      throw InputError(name + (raw.too_large ? ": JPEG too large: " : ": corrupt JPEG: ") + raw.error);
    return to_planes(raw, "jpeg");
  }
  throw InputError(name + ": not a PNG or JPEG file (unrecognised signature)");
}

Image load_image(const std::filesystem::path& path) {
  // A FIFO, folder or dangling symlink named x.png fails here saying what it is (never blocks).
  const std::vector<std::uint8_t> bytes = base::read_regular_file(path);
  return decode_image(bytes, path.string());
}

namespace {
struct PngWriteState {
  std::vector<std::uint8_t>* out;
  std::jmp_buf jump;
  char error[256];
};
void png_write_error_fn(png_structp png, png_const_charp message) {
  auto* st = static_cast<PngWriteState*>(png_get_error_ptr(png));
  std::snprintf(st->error, sizeof st->error, "%s", message);
  std::longjmp(st->jump, 1);
}
void png_write_fn(png_structp png, png_bytep data, png_size_t n) {
  auto* st = static_cast<PngWriteState*>(png_get_io_ptr(png));
  st->out->insert(st->out->end(), data, data + n);
}
void png_flush_fn(png_structp) {}

bool encode_png_c(const Rgb8* image, const png_bytep* rows, PngWriteState* st) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, st, png_write_error_fn, png_warning_fn);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (setjmp(st->jump)) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  if (!info) png_error(png, "out of memory");
  png_set_write_fn(png, st, png_write_fn, png_flush_fn);
  const int color = image->channels == 1   ? PNG_COLOR_TYPE_GRAY
                    : image->channels == 4 ? PNG_COLOR_TYPE_RGBA
                                           : PNG_COLOR_TYPE_RGB;
  png_set_IHDR(png, info, static_cast<png_uint_32>(image->width), static_cast<png_uint_32>(image->height), 8, color,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, const_cast<png_bytepp>(rows));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}
}  // namespace

std::vector<std::uint8_t> encode_png(const Rgb8& image) {
  if (image.channels != 1 && image.channels != 3 && image.channels != 4)
    throw std::invalid_argument("encode_png: channels must be 1, 3 or 4");
  if (image.pixels.size() != std::size_t(image.width) * image.height * image.channels)
    throw std::invalid_argument("encode_png: pixel buffer does not match the size");
  std::vector<std::uint8_t> out;
  std::vector<png_bytep> rows(static_cast<std::size_t>(image.height));
  const std::size_t stride = std::size_t(image.width) * image.channels;
  for (int i = 0; i < image.height; ++i) rows[std::size_t(i)] = const_cast<png_bytep>(image.pixels.data() + i * stride);
  PngWriteState st{&out, {}, {}};
  if (!encode_png_c(&image, rows.data(), &st))
    throw std::runtime_error(std::string("PNG encoding failed: ") + st.error);
  return out;
}

}  // namespace qeval::datasets
