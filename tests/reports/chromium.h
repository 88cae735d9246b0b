// Headless Chromium for the HTML report tests: find it, run it on a file URL (DOM dump or
// screenshot), console messages on stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace qeval::testing {

inline std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    FILE* p = popen((std::string("command -v ") + name + " 2>/dev/null").c_str(), "r");
    if (!p) continue;
    char buf[512];
    std::string path;
    while (fgets(buf, sizeof(buf), p)) path += buf;
    pclose(p);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (!path.empty()) return path;
  }
  return {};
}

// Runs headless Chromium on `url` with `mode_args`; stdout to out_file, stderr (console messages
// with --enable-logging=stderr) to err_file. Returns the exit status.
inline int run_chromium(const std::string& chromium, const std::filesystem::path& profile,
                        const std::string& mode_args, const std::string& url,
                        const std::filesystem::path& out_file, const std::filesystem::path& err_file) {
  const std::string cmd =
      "timeout 120 '" + chromium + "' --headless --no-sandbox --disable-gpu --no-first-run "
      "--disable-background-networking --disable-extensions --disable-sync --mute-audio "
      "--host-resolver-rules='MAP * ~NOTFOUND' --enable-logging=stderr --v=0 "
      "--user-data-dir='" + profile.string() + "' " + mode_args + " '" + url + "' > '" +
      out_file.string() + "' 2> '" + err_file.string() + "'";
  int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The DOM of `url` after its scripts ran (--dump-dom into out_dir/dom.html), Chromium's log
// (out_dir/chromium.log) and the console messages in it, one per line.
struct DomDump {
  int rc = -1;
  std::string dom, log, console;
};

inline DomDump dump_dom(const std::string& chromium, const std::filesystem::path& profile, const std::string& url,
                        const std::filesystem::path& out_dir) {
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  DomDump d;
  d.rc = run_chromium(chromium, profile, "--dump-dom", url, out_dir / "dom.html", out_dir / "chromium.log");
  d.dom = read(out_dir / "dom.html");
  d.log = read(out_dir / "chromium.log");
  std::istringstream lines(d.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find(":CONSOLE") != std::string::npos) d.console += line + "\n";
  return d;
}

// A report page rendered cleanly: no console message, its own error box empty, its last script
// ran (the body's data-rendered="1").
inline void expect_rendered_cleanly(const DomDump& page) {
  const std::string& dom = page.dom;
  EXPECT_TRUE(page.console.empty()) << "console output while rendering:\n" << page.console;
  const std::size_t box = dom.find("report-errors");
  EXPECT_NE(dom.find("<div id=\"report-errors\"></div>"), std::string::npos)
      << (box == std::string::npos ? std::string("no error box") : dom.substr(box, 400));
  EXPECT_TRUE(std::regex_search(dom, std::regex("<body[^>]*data-rendered=\"1\"")));
}

}  // namespace qeval::testing
