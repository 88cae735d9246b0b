#include "base/json_config.h"

#include <sstream>
#include <system_error>

#include "base/input_file.h"
#include "kernels/error.h"

namespace qeval::base {

using json = nlohmann::json;

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
// Follows the key path while parsing, to say where a parse error is ("checks[2].max"):
// nlohmann's error for `1e999` names only the token.
class KeyPathSax final : public json::json_sax_t {
 public:
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(json::number_integer_t) override { return value(); }
  bool number_unsigned(json::number_unsigned_t) override { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) override { return value(); }
  bool string(json::string_t&) override { return value(); }
  bool binary(json::binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({false, 0, {}});
    return true;
  }
  bool key(json::string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return value();
  }
  bool start_array(std::size_t) override {
    frames_.push_back({true, 0, {}});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return value();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

  // Where the value being parsed sits: "a.b[3]", "" at the top.
  std::string path() const {
    std::string p;
    for (const auto& f : frames_) {
      if (f.array) {
        p += '[';  // appended piece by piece: "[" + to_string(...) trips GCC 12's -Wrestrict
        p += std::to_string(f.index);
        p += ']';
      } else {
        if (!p.empty()) p += '.';
        p += f.key;
      }
    }
    return p;
  }

 private:
  struct Frame {
    bool array;
    std::size_t index;
    std::string key;
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  std::vector<Frame> frames_;
};

}  // namespace

json parse_json_text(const std::string& text, const std::string& source, const std::string& doc) {
  const std::string see = doc.empty() ? "" : " (see " + doc + ")";
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(source + ": not valid JSON: " + e.what() + see);
  } catch (const json::out_of_range& e) {
    // Number overflow (406): parsed again, following keys, to name the key.
    KeyPathSax sax;
    json::sax_parse(text, &sax);
    const std::string path = sax.path();
    throw InputError(source + (path.empty() ? "" : ": " + path) + ": a number is out of range (" + e.what() +
                     "; a double holds at most ~1.8e308)" + see);
  }
}

JsonConfig JsonConfig::load(const std::filesystem::path& path, std::string doc) {
  // Not std::ifstream: a FIFO named as a config blocked, a folder read as an empty file.
  return parse(read_regular_file_text(path), path.string(), std::move(doc));
}

JsonConfig JsonConfig::parse(const std::string& text, std::string source, std::string doc) {
  json j = parse_json_text(text, source, doc);
  JsonConfig c(j, std::move(source), "", std::move(doc));
  if (!j.is_object()) c.fail("the file must hold a JSON object");
  return c;
}

JsonConfig::JsonConfig(const json& value, std::string source, std::string path, std::string doc)
    : value_(value), source_(std::move(source)), path_(std::move(path)), doc_(std::move(doc)) {}

std::string JsonConfig::where() const { return path_.empty() ? source_ : source_ + ": " + path_; }

void JsonConfig::fail(const std::string& what) const {
  throw InputError(where() + ": " + what + (doc_.empty() ? "" : " (see " + doc_ + ")"));
}

bool JsonConfig::has(const std::string& key) const { return value_.is_object() && value_.contains(key); }

void JsonConfig::allow_keys(const std::vector<std::string>& valid) const {
  for (const auto& [k, v] : value_.items()) {
    bool ok = false;
    for (const auto& name : valid) ok = ok || name == k;
    if (!ok) fail("unknown key '" + k + "' (valid keys: " + join(valid) + ")");
  }
}

const json& JsonConfig::required(const std::string& key) const {
  if (!has(key)) fail("missing required key '" + key + "'");
  return value_.at(key);
}

JsonConfig JsonConfig::child(const json& v, const std::string& key) const {
  return JsonConfig(v, source_, path_.empty() ? key : path_ + "." + key, doc_);
}

std::string JsonConfig::get_string(const std::string& key) const {
  const json& v = required(key);
  if (!v.is_string()) child(v, key).fail("must be a string");
  return v.get<std::string>();
}

std::string JsonConfig::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::string JsonConfig::get_choice(const std::string& key, const std::vector<std::string>& choices,
                                   std::optional<std::string> fallback) const {
  if (!has(key) && fallback) return *fallback;
  std::string s = get_string(key);
  for (const auto& c : choices)
    if (c == s) return s;
  child(value_.at(key), key).fail("'" + s + "' is not one of: " + join(choices));
}

double JsonConfig::get_number(const std::string& key) const {
  const json& v = required(key);
  if (!v.is_number()) child(v, key).fail("must be a number");
  return v.get<double>();
}

double JsonConfig::get_number(const std::string& key, double fallback) const {
  return has(key) ? get_number(key) : fallback;
}

long long JsonConfig::get_int(const std::string& key) const {
  const json& v = required(key);
  if (!v.is_number_integer()) child(v, key).fail("must be an integer");
  return v.get<long long>();
}

long long JsonConfig::get_int(const std::string& key, long long fallback) const {
  return has(key) ? get_int(key) : fallback;
}

bool JsonConfig::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = value_.at(key);
  if (!v.is_boolean()) child(v, key).fail("must be true or false");
  return v.get<bool>();
}

std::vector<std::string> JsonConfig::get_strings(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const json& v = value_.at(key);
  if (!v.is_array()) child(v, key).fail("must be an array of strings");
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) child(v[i], key + "[" + std::to_string(i) + "]").fail("must be a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<double> JsonConfig::get_numbers(const std::string& key) const {
  std::vector<double> out;
  if (!has(key)) return out;
  const json& v = value_.at(key);
  if (!v.is_array()) child(v, key).fail("must be an array of numbers");
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number()) child(v[i], key + "[" + std::to_string(i) + "]").fail("must be a number");
    out.push_back(v[i].get<double>());
  }
  return out;
}

std::filesystem::path JsonConfig::get_path(const std::string& key) const {
  std::filesystem::path p = get_string(key);
  if (!p.is_absolute()) p = std::filesystem::path(source_).parent_path() / p;
  // A path the system cannot look up at all (a name over NAME_MAX, a symlink loop, a folder that
  // may not be searched) fails here, naming the key: std::filesystem's queries without an
  // error_code throw filesystem_error (exit 3) wherever the path is used next (found writing the
  // run-config fuzz target).
  std::error_code ec;
  (void)std::filesystem::status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    child(required(key), key).fail("cannot look up " + p.string() + ": " + ec.message());
  return p;
}

JsonConfig JsonConfig::object(const std::string& key) const {
  const json& v = required(key);
  JsonConfig c = child(v, key);
  if (!v.is_object()) c.fail("must be an object");
  return c;
}

std::optional<JsonConfig> JsonConfig::optional_object(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return object(key);
}

std::vector<JsonConfig> JsonConfig::array_of_objects(const std::string& key) const {
  std::vector<JsonConfig> out;
  if (!has(key)) return out;
  const json& v = value_.at(key);
  if (!v.is_array()) child(v, key).fail("must be an array of objects");
  for (std::size_t i = 0; i < v.size(); ++i) {
    JsonConfig c = child(v[i], key + "[" + std::to_string(i) + "]");
    if (!v[i].is_object()) c.fail("must be an object");
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace qeval::base
