// Headless Chromium for the HTML report tests: find it, run it on a file URL (DOM dump or
// screenshot), console messages on stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

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
inline int run_chromium(const std::string& chromium, const std::filesystem::path& profile, const std::string& mode_args,
                        const std::string& url, const std::filesystem::path& out_file,
                        const std::filesystem::path& err_file) {
  const std::string cmd = "timeout 120 '" + chromium +
                          "' --headless --no-sandbox --disable-gpu --no-first-run "
                          "--disable-background-networking --disable-extensions --disable-sync --mute-audio "
                          "--host-resolver-rules='MAP * ~NOTFOUND' --enable-logging=stderr --v=0 "
                          "--user-data-dir='" +
                          profile.string() + "' " + mode_args + " '" + url + "' > '" + out_file.string() + "' 2> '" +
                          err_file.string() + "'";
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

// How a page lays out at a given window width, measured in the browser after it loaded: the
// document's width against the viewport, the elements that stick out of it, the scroll boxes whose
// content is wider than the box (columns behind a horizontal scroll bar), the sections present,
// and the verdict banner's class and colour.
struct Layout {
  int rc = -1;
  int viewport = 0, scroll_width = 0;
  std::vector<std::string> beyond_viewport, scrolled, sections;
  std::string verdict_class, verdict_color;  // e.g. "verdict fail", "rgb(179, 38, 30)"
  std::string console, log;
};

// Copies `page` to out_dir/layout-<width>.html with a measuring script added, dumps its DOM at
// `width` x 1000 and reads the measurements back; also leaves a screenshot out_dir/<stem>-<width>.png
// (the page as a person at that width sees its top).
inline Layout measure_layout(const std::string& chromium, const std::filesystem::path& profile,
                             const std::filesystem::path& page, const std::filesystem::path& out_dir,
                             int width = 1400) {
  static constexpr const char* kScript = R"JS(<script>window.addEventListener('load',function(){
 const W=document.documentElement.clientWidth,out={viewport:W,scrollWidth:document.documentElement.scrollWidth,beyond:[],scrolled:[],sections:[]};
 const name=e=>e.tagName.toLowerCase()+(e.id?'#'+e.id:'')+(typeof e.className==='string'&&e.className.trim()?'.'+e.className.trim().split(/\s+/).join('.'):'');
 const path=e=>{const p=[];for(let x=e;x&&x!==document.body&&p.length<4;x=x.parentElement)p.unshift(name(x));return p.join(' > ');};
 document.querySelectorAll('body *').forEach(e=>{if(e.id==='layout-check')return;const r=e.getBoundingClientRect(),cs=getComputedStyle(e);
  if(r.width>0&&r.right>W+1&&out.beyond.length<20)out.beyond.push(path(e)+' (right edge '+Math.round(r.right)+' px)');
  if((cs.overflowX==='auto'||cs.overflowX==='scroll')&&e.scrollWidth>e.clientWidth+1&&out.scrolled.length<20)
   out.scrolled.push(path(e)+' ('+e.scrollWidth+' px of content in '+e.clientWidth+')');});
 document.querySelectorAll('section[id],h2[id]').forEach(e=>out.sections.push(e.id));
 const v=document.querySelector('.verdict');if(v){out.verdictClass=v.className;out.verdictColor=getComputedStyle(v).backgroundColor;}
 const pre=document.createElement('pre');pre.id='layout-check';pre.textContent=JSON.stringify(out);document.body.appendChild(pre);});</script>)JS";
  Layout L;
  std::ifstream in(page);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t body = html.rfind("</body>");
  if (body == std::string::npos) {
    L.log = page.string() + ": no </body>";
    return L;
  }
  html.insert(body, kScript);
  const std::string tag = page.stem().string() + "-" + std::to_string(width);
  const std::filesystem::path copy = page.parent_path() / ("layout-" + tag + ".html");
  std::ofstream(copy) << html;
  const std::filesystem::path dir = out_dir / ("layout-" + tag);
  std::filesystem::create_directories(dir);
  const std::string size = "--window-size=" + std::to_string(width) + ",1000";
  L.rc = run_chromium(chromium, profile, size + " --virtual-time-budget=5000 --dump-dom",
                      "file://" + std::filesystem::absolute(copy).string(), dir / "dom.html", dir / "chromium.log");
  run_chromium(chromium, profile,
               "--hide-scrollbars " + size + " --screenshot='" + (out_dir / (tag + ".png")).string() + "'",
               "file://" + std::filesystem::absolute(page).string(), dir / "screenshot.out", dir / "screenshot.log");
  auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string dom = read(dir / "dom.html");
  L.log = read(dir / "chromium.log");
  std::istringstream lines(L.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find(":CONSOLE") != std::string::npos) L.console += line + "\n";
  const std::string open = "<pre id=\"layout-check\">";
  const std::size_t a = dom.find(open), b = a == std::string::npos ? a : dom.find("</pre>", a);
  if (b == std::string::npos) {
    L.log += "\n(no layout-check element in the DOM)";
    return L;
  }
  std::string text = dom.substr(a + open.size(), b - a - open.size());
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"&gt;", ">"}, {"&lt;", "<"}, {"&quot;", "\""}, {"&amp;", "&"}})
    for (std::size_t k = 0; (k = text.find(from, k)) != std::string::npos; k += to.size())
      text.replace(k, from.size(), to);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    L.log += "\n(layout-check is not JSON: " + text + ")";
    return L;
  }
  L.viewport = j.value("viewport", 0);
  L.scroll_width = j.value("scrollWidth", 0);
  L.beyond_viewport = j.value("beyond", std::vector<std::string>{});
  L.scrolled = j.value("scrolled", std::vector<std::string>{});
  L.sections = j.value("sections", std::vector<std::string>{});
  L.verdict_class = j.value("verdictClass", std::string());
  L.verdict_color = j.value("verdictColor", std::string());
  return L;
}

// What every report page must do at 1400 px: no horizontal overflow of the page, no columns behind
// a horizontal scroll bar, no console message, every section in `sections`, and a banner whose
// colour is the gate's verdict (#1f7a3f pass, #b3261e fail).
inline void expect_readable_at(const Layout& L, int width, const std::vector<std::string>& sections, bool passed) {
  ASSERT_EQ(L.rc, 0) << L.log;
  ASSERT_GT(L.viewport, 0) << L.log;
  EXPECT_LE(L.viewport, width);
  EXPECT_LE(L.scroll_width, L.viewport) << "the page scrolls horizontally at " << width << " px";
  std::string beyond, scrolled;
  for (const auto& e : L.beyond_viewport) beyond += "  " + e + "\n";
  for (const auto& e : L.scrolled) scrolled += "  " + e + "\n";
  EXPECT_TRUE(L.beyond_viewport.empty()) << "beyond the " << width << " px window:\n" << beyond;
  EXPECT_TRUE(L.scrolled.empty()) << "content behind a horizontal scroll bar:\n" << scrolled;
  EXPECT_TRUE(L.console.empty()) << "console output:\n" << L.console;
  for (const auto& s : sections)
    EXPECT_NE(std::find(L.sections.begin(), L.sections.end(), s), L.sections.end()) << "no section #" << s;
  EXPECT_EQ(L.verdict_class, passed ? "verdict pass" : "verdict fail");
  EXPECT_EQ(L.verdict_color, passed ? "rgb(31, 122, 63)" : "rgb(179, 38, 30)");
}

// The difference heatmaps' amplified view (reports/html.h difference_scale_legend): copies `page`
// to out_dir/toggle.html with a script that presses the toggle, checks that every difference image,
// caption and the legend switched to x8 (and the button says how to go back), presses it again and
// checks the fixed scale is back. Returns "x1,x8,back,images", e.g. "true,true,true,12".
inline std::string check_gain_toggle(const std::string& chromium, const std::filesystem::path& profile,
                                     const std::filesystem::path& page, const std::filesystem::path& out_dir) {
  std::ifstream in(page);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string probe = R"(<script>
(function(){const b=document.querySelector('.gain-toggle'),imgs=[...document.querySelectorAll('img[data-x8]')];
 const shown=k=>imgs.length>0&&imgs.every(i=>i.getAttribute('src')===i.dataset[k]);
 const caps=[...document.querySelectorAll('figcaption.diff-cap')];
 const x1=!!b&&shown('x1');if(b)b.click();
 const x8=!!b&&shown('x8')&&caps.length>0&&caps.every(c=>c.textContent.includes('x8'))
   &&!document.querySelector('.gain-x8').hidden&&document.querySelector('.gain-x1').hidden&&b.textContent.includes('x1');
 if(b)b.click();const back=!!b&&shown('x1');
 document.body.setAttribute('data-gain-check',[x1,x8,back,imgs.length].join(','));})();
</script></body>)";
  const std::size_t at = html.rfind("</body>");
  if (at == std::string::npos) return "no </body>";
  html.replace(at, 7, probe);
  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir / "toggle.html") << html;
  const DomDump dom =
      dump_dom(chromium, profile, "file://" + std::filesystem::absolute(out_dir / "toggle.html").string(), out_dir);
  EXPECT_EQ(dom.console, "");
  const std::string key = "data-gain-check=\"";
  const std::size_t k = dom.dom.find(key);
  if (k == std::string::npos) return "probe did not run (rc " + std::to_string(dom.rc) + ")";
  return dom.dom.substr(k + key.size(), dom.dom.find('"', k + key.size()) - k - key.size());
}

}  // namespace qeval::testing
