// A JSON Schema (draft 2020-12) validator for the subset of keywords docs/*.schema.json use.
// A schema using any other keyword is rejected up front, so a schema can never rely on a keyword
// this validator would silently skip. Debian 12 packages no C++ validator without heavy
// dependencies (libvalijson-dev pulls Qt and Poco), hence this test helper.
#pragma once

#include <cmath>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qeval::testing {

class JsonSchema {
 public:
  explicit JsonSchema(nlohmann::json schema) : root_(std::move(schema)) { check_keywords(root_, "#"); }

  // Every violation as "path: what" (path like $.variants[2].kind), at most max_errors of them.
  std::vector<std::string> validate(const nlohmann::json& doc, std::size_t max_errors = 20) const {
    std::vector<std::string> errors;
    validate(root_, doc, "$", errors);
    if (errors.size() > max_errors) errors.resize(max_errors);
    return errors;
  }

 private:
  using json = nlohmann::json;

  static const std::set<std::string>& supported() {
    static const std::set<std::string> k = {"$schema",     "$id",      "$defs",      "$ref",     "title",
                                            "description", "type",     "properties", "required", "additionalProperties",
                                            "items",       "minItems", "enum",       "const",    "anyOf",
                                            "minimum",     "maximum",  "minLength",  "pattern"};
    return k;
  }

  void check_keywords(const json& s, const std::string& where) const {
    if (s.is_boolean()) return;
    if (!s.is_object()) throw std::invalid_argument(where + ": a schema must be an object or boolean");
    for (const auto& item : s.items()) {
      const std::string& key = item.key();
      if (!supported().count(key))
        throw std::invalid_argument(where + ": keyword '" + key + "' is not supported by this validator");
      if (key == "properties" || key == "$defs") {
        for (const auto& sub : item.value().items()) check_keywords(sub.value(), where + "/" + key + "/" + sub.key());
      } else if (key == "items" || key == "additionalProperties") {
        check_keywords(item.value(), where + "/" + key);
      } else if (key == "anyOf") {
        for (std::size_t i = 0; i < item.value().size(); ++i)
          check_keywords(item.value()[i], where + "/anyOf/" + std::to_string(i));
      } else if (key == "$ref") {
        resolve(item.value().get<std::string>());  // throws when dangling
      }
    }
  }

  const json& resolve(const std::string& ref) const {
    if (ref.rfind("#/", 0) != 0) throw std::invalid_argument("only local $refs are supported: " + ref);
    json::json_pointer p(ref.substr(1));
    if (!root_.contains(p)) throw std::invalid_argument("dangling $ref " + ref);
    return root_.at(p);
  }

  static bool has_type(const json& v, const std::string& type) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "number") return v.is_number();
    if (type == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    throw std::invalid_argument("unknown type '" + type + "'");
  }

  static std::size_t code_points(const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  void validate(const json& s, const json& v, const std::string& path, std::vector<std::string>& errors) const {
    if (s.is_boolean()) {
      if (!s.get<bool>()) errors.push_back(path + ": not allowed here");
      return;
    }
    auto fail = [&](const std::string& what) { errors.push_back(path + ": " + what); };
    if (s.contains("$ref")) validate(resolve(s["$ref"].get<std::string>()), v, path, errors);
    if (s.contains("type")) {
      const json& t = s["type"];
      bool ok = false;
      if (t.is_string()) {
        ok = has_type(v, t.get<std::string>());
      } else {
        for (const auto& one : t) ok = ok || has_type(v, one.get<std::string>());
      }
      if (!ok) return fail("expected type " + t.dump() + ", found " + v.dump().substr(0, 60));
    }
    if (s.contains("const") && v != s["const"]) fail("expected " + s["const"].dump());
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& e : s["enum"]) found = found || v == e;
      if (!found) fail("expected one of " + s["enum"].dump() + ", found " + v.dump().substr(0, 60));
    }
    if (s.contains("anyOf")) {
      bool any = false;
      std::string why;
      for (const auto& branch : s["anyOf"]) {
        std::vector<std::string> sub;
        validate(branch, v, path, sub);
        if (sub.empty()) {
          any = true;
          break;
        }
        why += (why.empty() ? "" : " | ") + sub.front();
      }
      if (!any) fail("matches no anyOf branch (" + why + ")");
    }
    if (v.is_number()) {
      if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>())
        fail("below the minimum " + s["minimum"].dump());
      if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>())
        fail("above the maximum " + s["maximum"].dump());
    }
    if (v.is_string()) {
      const auto& str = v.get_ref<const std::string&>();
      if (s.contains("minLength") && code_points(str) < s["minLength"].get<std::size_t>())
        fail("shorter than " + s["minLength"].dump() + " characters");
      if (s.contains("pattern") &&
          !std::regex_search(str, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)))
        fail("does not match " + s["pattern"].dump() + ": \"" + str + "\"");
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<std::size_t>())
        fail("fewer than " + s["minItems"].dump() + " items");
      if (s.contains("items"))
        for (std::size_t i = 0; i < v.size(); ++i)
          validate(s["items"], v[i], path + "[" + std::to_string(i) + "]", errors);
    }
    if (v.is_object()) {
      if (s.contains("required"))
        for (const auto& key : s["required"])
          if (!v.contains(key.get<std::string>())) fail("missing required key " + key.dump());
      for (const auto& item : v.items()) {
        const std::string child = path + "." + item.key();
        if (s.contains("properties") && s["properties"].contains(item.key())) {
          validate(s["properties"][item.key()], item.value(), child, errors);
        } else if (s.contains("additionalProperties")) {
          const json& extra = s["additionalProperties"];
          if (extra.is_boolean() && !extra.get<bool>()) errors.push_back(child + ": key not allowed by the schema");
          else validate(extra, item.value(), child, errors);
        }
      }
    }
  }

  json root_;
};

}  // namespace qeval::testing
