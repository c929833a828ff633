// Topology (sysfs parsing, fake block split, selection) and page queries.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "numa/page_query.h"
#include "../test_util.h"
#include "numa/topology.h"

using namespace hinamoe::numa;

TEST(cpulist_parsing) {
  std::vector<int> v;
  CHECK(parse_cpulist("0-3,8-11\n", &v));
  CHECK((v == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11}));
  CHECK(parse_cpulist("5", &v) && v == std::vector<int>{5});
  CHECK(parse_cpulist("", &v) && v.empty());
  CHECK(parse_cpulist("\n", &v) && v.empty());
  CHECK(parse_cpulist("3,1-2,1", &v) && (v == std::vector<int>{1, 2, 3}));
  CHECK(!parse_cpulist("a-b", &v));
  CHECK(!parse_cpulist("3-1", &v));
  CHECK(!parse_cpulist("1,,2", &v));
  CHECK(!parse_cpulist("-1", &v));
}

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

TEST(sysfs_topology_from_fake_tree) {
  char tmpl[] = "/tmp/hinamoe_numa_sysfs_XXXXXX";
  const char* root_c = mkdtemp(tmpl);
  CHECK(root_c != nullptr);
  if (!root_c) return;
  const std::string root = root_c;
  for (const char* d : {"node0", "node2", "nodeX", "power"}) mkdir((root + "/" + d).c_str(), 0700);
  write_file(root + "/node0/cpulist", "0-3\n");
  write_file(root + "/node2/cpulist", "4-5,7\n");
  write_file(root + "/nodeX/cpulist", "9\n");
  write_file(root + "/online", "0,2\n");
  auto t = make_sysfs_topology(root);
  CHECK(t->num_nodes() == 2);
  CHECK(!t->is_fake());
  CHECK(t->name() == "sysfs");
  if (t->num_nodes() == 2) {
    CHECK(t->os_node_id(0) == 0 && t->os_node_id(1) == 2);
    CHECK(t->node_index_of_os_id(2) == 1 && t->node_index_of_os_id(1) == -1);
    CHECK((t->cpus(1) == std::vector<int>{4, 5, 7}));
    CHECK(t->node_of_cpu(2) == 0 && t->node_of_cpu(7) == 1);
    CHECK(t->node_of_cpu(6) == 0 && t->node_of_cpu(-1) == 0 && t->node_of_cpu(1000) == 0);
    const int cur = t->current_node();
    CHECK(cur >= 0 && cur < 2);
  }
  for (const char* f : {"node0/cpulist", "node2/cpulist", "nodeX/cpulist", "online"}) std::remove((root + "/" + f).c_str());
  for (const char* d : {"node0", "node2", "nodeX", "power"}) rmdir((root + "/" + d).c_str());
  rmdir(root.c_str());

  // No sysfs: one node with every configured CPU.
  auto fb = make_sysfs_topology(root + "/does-not-exist");
  CHECK(fb->num_nodes() == 1);
  CHECK(static_cast<long>(fb->cpus(0).size()) == std::max(1L, sysconf(_SC_NPROCESSORS_CONF)));
  CHECK(fb->current_node() == 0);
}

TEST(real_sysfs_topology) {
  std::string err;
  auto t = select_topology("sysfs", &err);
  CHECK(t != nullptr && err.empty());
  if (!t) return;
  std::printf("    this machine: %d NUMA node(s)", t->num_nodes());
  for (int n = 0; n < t->num_nodes(); ++n) std::printf(" [node%d: %zu cpus]", t->os_node_id(n), t->cpus(n).size());
  std::printf(", current node %d\n", t->current_node());
  CHECK(t->num_nodes() >= 1);
  CHECK(!t->is_fake());
  const int cur = t->current_node();
  CHECK(cur >= 0 && cur < t->num_nodes());
  const int cpu = sched_getcpu();
  CHECK(cpu < 0 || t->node_of_cpu(cpu) == cur || t->num_nodes() > 1);  // may migrate between calls on >1 node
  auto a = select_topology("auto", &err);
  CHECK(a != nullptr && a->num_nodes() == t->num_nodes());
}

TEST(fake_topologies) {
  auto real = make_sysfs_topology();
  std::vector<int> all;
  for (int n = 0; n < real->num_nodes(); ++n) all.insert(all.end(), real->cpus(n).begin(), real->cpus(n).end());
  std::sort(all.begin(), all.end());
  for (int nodes : {2, 4, 8}) {
    std::string err;
    auto t = select_topology("fake:" + std::to_string(nodes), &err);
    CHECK_MSG(t != nullptr && err.empty(), "fake:" << nodes << " -> " << err);
    if (!t) continue;
    CHECK(t->num_nodes() == nodes);
    CHECK(t->is_fake());
    CHECK(t->name() == "fake:" + std::to_string(nodes));
    // Blocks: concatenating nodes in order gives the sorted CPU list, sizes differ by <= 1.
    std::vector<int> cat;
    size_t lo = all.size(), hi = 0;
    for (int n = 0; n < nodes; ++n) {
      CHECK(t->os_node_id(n) == n);
      cat.insert(cat.end(), t->cpus(n).begin(), t->cpus(n).end());
      lo = std::min(lo, t->cpus(n).size());
      hi = std::max(hi, t->cpus(n).size());
      for (int c : t->cpus(n)) CHECK(t->node_of_cpu(c) == n);
    }
    CHECK(cat == all);
    CHECK(hi - lo <= 1);
    // current_node from several threads is always a valid fake node.
    std::vector<int> seen(4, -1);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i) th.emplace_back([&, i] { seen[static_cast<size_t>(i)] = t->current_node(); });
    for (auto& x : th) x.join();
    for (int s : seen) CHECK_MSG(s >= 0 && s < nodes, "current_node " << s);
  }
  // A fake split of a synthetic 16-CPU machine: node n gets CPUs [n*16/N, (n+1)*16/N).
  {
    char tmpl[] = "/tmp/hinamoe_numa_sysfs_XXXXXX";
    const char* root = mkdtemp(tmpl);
    CHECK(root != nullptr);
    if (root) {
      const std::string r = root;
      mkdir((r + "/node0").c_str(), 0700);
      write_file(r + "/node0/cpulist", "0-15");
      auto base = make_sysfs_topology(r);
      auto f4 = make_fake_topology(4, *base);
      CHECK((f4->cpus(1) == std::vector<int>{4, 5, 6, 7}));
      CHECK(f4->node_of_cpu(13) == 3);
      std::remove((r + "/node0/cpulist").c_str());
      rmdir((r + "/node0").c_str());
      rmdir(r.c_str());
    }
  }
}

TEST(select_topology_errors) {
  for (const char* bad : {"", "fake", "fake:", "fake:3", "fake:16", "fake:0", "fake:-2", "fake:2x", "numa", "SYSFS"}) {
    std::string err;
    auto t = select_topology(bad, &err);
    CHECK_MSG(t == nullptr, "'" << bad << "' accepted");
    CHECK_MSG(!err.empty() && err.find("fake:4") != std::string::npos, "'" << bad << "' error: " << err);
  }
  CHECK(select_topology("nope", nullptr) == nullptr);  // null error pointer is fine
  setenv("HINAMOE_NUMA_TOPOLOGY", "fake:4", 1);
  CHECK(topology_name_from_env() == "fake:4");
  unsetenv("HINAMOE_NUMA_TOPOLOGY");
  CHECK(topology_name_from_env() == "sysfs");
}

TEST(page_node_on_real_memory) {
  auto topo = make_sysfs_topology();
  auto valid = [&](int n) { return n == -1 || topo->node_index_of_os_id(n) >= 0; };
  const size_t bytes = 64 * 4096 + 123;
  char* buf = static_cast<char*>(std::malloc(bytes));
  CHECK(buf != nullptr);
  if (!buf) return;
  std::memset(buf, 1, bytes);
  const int n = page_node(buf);
  std::printf("    page_node(malloc'ed, touched) = %d\n", n);
  CHECK_MSG(n == 0 || n == -1 || (topo->num_nodes() > 1 && valid(n)), "page_node " << n);
  CHECK(valid(page_node(buf + bytes - 1)));
  int stack_var = 7;
  CHECK(valid(page_node(&stack_var)));
  CHECK(page_node(nullptr) == -1);
  // Batch query over the buffer's pages.
  std::vector<const void*> pages;
  for (size_t off = 0; off < bytes; off += 4096) pages.push_back(buf + off);
  std::vector<int> out(pages.size(), -7);
  page_nodes(pages.data(), pages.size(), out.data());
  for (int x : out) CHECK(valid(x));
  // One node: every touched page is on the only node (or unknown everywhere).
  if (topo->num_nodes() == 1) {
    int first = -1;
    const bool il = is_interleaved(buf, bytes, 1, &first);
    CHECK(!il || first == 0);
  }
  std::free(buf);
  // Mapped but never touched, then unmapped: unknown, never a crash.
  const long ps = static_cast<long>(system_page_size());
  void* m = mmap(nullptr, static_cast<size_t>(4 * ps), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(m != MAP_FAILED);
  if (m != MAP_FAILED) {
    CHECK(valid(page_node(m)));  // -1 (not present) with move_pages
    munmap(m, static_cast<size_t>(4 * ps));
    CHECK(page_node(m) == -1);
    CHECK(!is_interleaved(m, static_cast<size_t>(4 * ps), 1));
  }
}

TEST(is_interleaved_fake_maps) {
  for (int nodes : {1, 2, 4, 8}) {
    for (int64_t pages : {int64_t(1), int64_t(3), int64_t(17), int64_t(1000), int64_t(100000)}) {
      const int first = static_cast<int>(ht::randint(0, nodes - 1));
      FakePageMap map{nodes, first};
      int got = -1;
      CHECK_MSG(is_interleaved(map, pages, nodes, &got) && got == first,
                "nodes " << nodes << " pages " << pages << " first " << first << " got " << got);
      if (nodes > 1 && pages > 1) {
        // First-touch: everything on one node.
        CHECK(!is_interleaved([](int64_t) { return 0; }, pages, nodes));
        // Interleaved over fewer nodes than claimed.
        // (indistinguishable while the buffer has no more pages than the smaller cycle)
        FakePageMap fewer{nodes / 2, 0};
        if (pages > fewer.nodes) CHECK(!is_interleaved(fewer, pages, nodes));
      }
      // Unknown pages are skipped; all unknown is not interleaved.
      CHECK(is_interleaved([&](int64_t p) { return p % 3 == 1 ? -1 : map(p); }, pages, nodes, &got) && got == first);
      CHECK(!is_interleaved([](int64_t) { return -1; }, pages, nodes));
    }
  }
  // A page out of the cycle at a sampled position (page 0 is always sampled) is caught.
  FakePageMap m{4, 1};
  CHECK(!is_interleaved([&](int64_t p) { return p == 0 ? 3 : m(p); }, 50000, 4));
  // m(49999) == 0, so report 2 there.
  CHECK(!is_interleaved([&](int64_t p) { return p == 49999 ? 2 : m(p); }, 50000, 4));
  CHECK(is_interleaved(m, 100, 4, nullptr, 0));  // max_samples clamps to >= 1
  CHECK(!is_interleaved([](int64_t) { return 5; }, 10, 4));  // node out of range
  CHECK(!is_interleaved(m, 0, 4));
}
