// fopencookie streams over descriptors 1 and 2 that escape bytes outside well-formed UTF-8.
#include "base/escaped_stdio.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>

#include "base/utf8.h"

namespace qeval::base {

namespace {

struct Sink {
  int fd;
  std::string held;  // the start of a sequence the previous write cut
};

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(std::size_t(n));
  }
  return true;
}

ssize_t sink_write(void* cookie, const char* data, std::size_t size) {
  auto* sink = static_cast<Sink*>(cookie);
  std::string text = std::move(sink->held);
  text.append(data, size);
  const std::size_t hold = incomplete_utf8_tail(text);
  sink->held.assign(text, text.size() - hold, hold);
  text.resize(text.size() - hold);
  if (!write_all(sink->fd, escape_invalid_utf8(text))) return -1;
  return ssize_t(size);
}

int sink_close(void* cookie) {
  auto* sink = static_cast<Sink*>(cookie);
  const bool ok = write_all(sink->fd, escape_invalid_utf8(sink->held));  // a cut sequence never completed
  delete sink;
  return ok ? 0 : -1;
}

FILE* escaped_stream(int fd) {
  cookie_io_functions_t io{};
  io.write = sink_write;
  io.close = sink_close;
  auto* sink = new Sink{fd, {}};
  FILE* f = fopencookie(sink, "w", io);
  if (!f) delete sink;
  return f;
}

}  // namespace

std::size_t incomplete_utf8_tail(std::string_view text) {
  // A lead byte within the last 3 bytes, followed only by continuation bytes, fewer than it needs.
  for (std::size_t k = 1; k <= 3 && k <= text.size(); ++k) {
    const auto b = static_cast<std::uint8_t>(text[text.size() - k]);
    if (b >= 0x80 && b <= 0xBF) continue;  // a continuation byte: look further back
    std::size_t need = 0;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3;
    else if (b >= 0xF0 && b <= 0xF4) need = 4;
    if (need == 0 || need <= k) return 0;  // ASCII, an invalid byte, or a complete sequence
    if (k == 1) return 1;                  // a lead byte alone: whatever follows decides
    // Its second byte is there (its range depends on the lead byte); the rest take 0x80..0xBF.
    return first_invalid_utf8(std::string(text.substr(text.size() - k)) + std::string(need - k, '\x80'))
               ? 0  // no continuation makes it well-formed (an overlong or surrogate start): escape now
               : k;
  }
  return 0;
}

void escape_invalid_utf8_on_stdio() {
  std::fflush(stdout);
  std::fflush(stderr);
  if (FILE* out = escaped_stream(STDOUT_FILENO)) {
    std::setvbuf(out, nullptr, ::isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
    stdout = out;
  }
  if (FILE* err = escaped_stream(STDERR_FILENO)) {
    std::setvbuf(err, nullptr, _IONBF, 0);
    stderr = err;
  }
}

}  // namespace qeval::base
