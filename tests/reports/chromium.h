// Headless Chromium for the HTML report tests: find it, run it on a file URL (DOM dump or
// screenshot), console messages on stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
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

}  // namespace qeval::testing
