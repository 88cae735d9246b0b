// Reading the JSON files users write (pipeline.json, recipes, gates, run configs) with errors that
// name the file, the key path and what was expected, as InputError (exit 2). Unknown keys are
// errors that list the valid ones: a typo must never silently fall back to a default.
//
//   auto root = JsonConfig::load(path, "docs/recipes.md");
//   root.allow_keys({"format", "levels", "calibration"});
//   std::string fmt = root.get_string("format");           // required
//   double alpha = root.get_number("alpha", 0.8);           // optional with default
//   JsonConfig cal = root.object("calibration");            // nested, errors say "calibration.method"
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qeval::base {

// Parses JSON text from `source` (a file name): InputError (exit 2) for text that is not JSON and
// for a number out of double's range (`1e999`), naming the key path of that number.
nlohmann::json parse_json_text(const std::string& text, const std::string& source, const std::string& doc = {});

class JsonConfig {
 public:
  // Reads and parses a file; `doc` (e.g. "docs/pipelines.md") is quoted in every error.
  static JsonConfig load(const std::filesystem::path& path, std::string doc = {});
  static JsonConfig parse(const std::string& text, std::string source, std::string doc = {});
  JsonConfig(const nlohmann::json& value, std::string source, std::string path, std::string doc);

  const nlohmann::json& value() const { return value_; }
  const std::string& source() const { return source_; }   // the file name
  const std::string& path() const { return path_; }       // key path inside it, "" at the root
  std::string where() const;                              // "file: key.path"
  [[noreturn]] void fail(const std::string& what) const;  // throws InputError at this location

  bool has(const std::string& key) const;
  // Every key of this object must be one of `valid` (the error lists them).
  void allow_keys(const std::vector<std::string>& valid) const;

  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // A string that must be one of `choices` (the error lists them).
  std::string get_choice(const std::string& key, const std::vector<std::string>& choices,
                         std::optional<std::string> fallback = std::nullopt) const;
  double get_number(const std::string& key) const;
  double get_number(const std::string& key, double fallback) const;
  long long get_int(const std::string& key) const;
  long long get_int(const std::string& key, long long fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string> get_strings(const std::string& key) const;  // [] when absent
  std::vector<double> get_numbers(const std::string& key) const;       // [] when absent
  // A path relative to the config file's folder (absolute paths stay as they are).
  std::filesystem::path get_path(const std::string& key) const;

  JsonConfig object(const std::string& key) const;  // required nested object
  std::optional<JsonConfig> optional_object(const std::string& key) const;
  std::vector<JsonConfig> array_of_objects(const std::string& key) const;  // [] when absent

 private:
  const nlohmann::json& required(const std::string& key) const;
  JsonConfig child(const nlohmann::json& v, const std::string& key) const;

  nlohmann::json value_;
  std::string source_, path_, doc_;
};

}  // namespace qeval::base
