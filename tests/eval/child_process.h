// The built qeval started in the background (stdout and stderr into a log file), with SIGINT and
// SIGTERM at their default actions whatever the test runner set: for tests that signal or kill a
// running verb (hardening_signals_test.cc, run/run_resume_test.cc).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace qeval::testing {

class QevalChild {
 public:
  QevalChild(const std::vector<std::string>& args, const std::filesystem::path& log) : log_(log) {
    std::vector<std::string> all{QEVAL_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;  // whatever the test runner ignores, the child gets the default actions
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    if (posix_spawn(&pid_, all[0].c_str(), &fa, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    start_ = std::chrono::steady_clock::now();
  }
  QevalChild(const QevalChild&) = delete;
  QevalChild& operator=(const QevalChild&) = delete;
  ~QevalChild() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  // Waits; "exit N" when it exited, "signal N" when a signal ended it.
  std::string wait() {
    if (!waited_ && pid_ > 0) {
      int st = 0;
      struct rusage usage {};
      ::wait4(pid_, &st, 0, &usage);
      peak_kb_ = usage.ru_maxrss;
      waited_ = true;
      code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      how_ = WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st)) : "signal " + std::to_string(WTERMSIG(st));
    }
    return how_;
  }
  // Waits; the exit code, or 128 + the signal that ended it.
  int exit_code() {
    wait();
    return code_;
  }
  // Waits; the peak resident memory (ru_maxrss) in KB.
  long peak_rss_kb() {
    wait();
    return peak_kb_;
  }
  std::string log() const { return read_text(log_); }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  bool waited_ = false;
  int code_ = -1;
  long peak_kb_ = 0;
  std::string how_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace qeval::testing
