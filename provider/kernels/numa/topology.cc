// Topology implementations: sysfs reader, block-split fake, name selection.
#include "topology.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace hinamoe {
namespace numa {

namespace {

constexpr int kMaxCpuId = 1 << 20;  // sanity bound for parsed cpu ids

class ConcreteTopology final : public Topology {
 public:
  ConcreteTopology(std::string name, bool fake, std::vector<int> os_ids, std::vector<std::vector<int>> cpus)
      : Topology(std::move(name), fake, std::move(os_ids), std::move(cpus)) {}
};

bool parse_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\n' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\n' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

std::vector<int> all_configured_cpus() {
  long n = sysconf(_SC_NPROCESSORS_CONF);
  if (n < 1) n = 1;
  if (n > kMaxCpuId) n = kMaxCpuId;
  std::vector<int> cpus(static_cast<size_t>(n));
  for (long i = 0; i < n; ++i) cpus[static_cast<size_t>(i)] = static_cast<int>(i);
  return cpus;
}

}  // namespace

Topology::Topology(std::string name, bool fake, std::vector<int> os_ids, std::vector<std::vector<int>> cpus)
    : name_(std::move(name)), fake_(fake), os_ids_(std::move(os_ids)), cpus_(std::move(cpus)) {
  int max_cpu = -1;
  for (const auto& list : cpus_)
    for (int c : list) max_cpu = std::max(max_cpu, c);
  cpu_to_node_.assign(static_cast<size_t>(max_cpu + 1), -1);
  for (size_t n = 0; n < cpus_.size(); ++n)
    for (int c : cpus_[n])
      if (cpu_to_node_[static_cast<size_t>(c)] < 0) cpu_to_node_[static_cast<size_t>(c)] = static_cast<int>(n);
}

int Topology::node_index_of_os_id(int os_id) const {
  for (size_t i = 0; i < os_ids_.size(); ++i)
    if (os_ids_[i] == os_id) return static_cast<int>(i);
  return -1;
}

int Topology::node_of_cpu(int cpu) const {
  if (cpu < 0 || static_cast<size_t>(cpu) >= cpu_to_node_.size()) return 0;
  const int n = cpu_to_node_[static_cast<size_t>(cpu)];
  return n < 0 ? 0 : n;
}

int Topology::current_node() const {
  if (cpus_.size() <= 1) return 0;
  return node_of_cpu(sched_getcpu());  // -1 on failure maps to node 0
}

bool parse_cpulist(const std::string& text, std::vector<int>* out) {
  out->clear();
  const std::string t = trim(text);
  if (t.empty()) return true;
  std::stringstream ss(t);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string::npos) {
      if (!parse_int(item, &lo)) return false;
      hi = lo;
    } else {
      if (!parse_int(item.substr(0, dash), &lo) || !parse_int(item.substr(dash + 1), &hi)) return false;
    }
    if (lo > hi || hi >= kMaxCpuId) return false;
    for (int c = lo; c <= hi; ++c) out->push_back(c);
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return true;
}

std::unique_ptr<Topology> make_sysfs_topology(const std::string& root) {
  std::vector<std::pair<int, std::vector<int>>> nodes;
  if (DIR* dir = opendir(root.c_str())) {
    while (const dirent* ent = readdir(dir)) {
      const std::string entry = ent->d_name;
      int id = 0;
      if (entry.size() <= 4 || entry.compare(0, 4, "node") != 0 || !parse_int(entry.substr(4), &id)) continue;
      std::ifstream f(root + "/" + entry + "/cpulist");
      if (!f) continue;
      std::stringstream buf;
      buf << f.rdbuf();
      std::vector<int> cpus;
      if (!parse_cpulist(buf.str(), &cpus)) continue;
      nodes.emplace_back(id, std::move(cpus));
    }
    closedir(dir);
  }
  if (nodes.empty()) {
    return std::make_unique<ConcreteTopology>("sysfs", false, std::vector<int>{0},
                                              std::vector<std::vector<int>>{all_configured_cpus()});
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const std::pair<int, std::vector<int>>& a, const std::pair<int, std::vector<int>>& b) {
              return a.first < b.first;
            });
  std::vector<int> ids;
  std::vector<std::vector<int>> cpus;
  for (auto& n : nodes) {
    ids.push_back(n.first);
    cpus.push_back(std::move(n.second));
  }
  return std::make_unique<ConcreteTopology>("sysfs", false, std::move(ids), std::move(cpus));
}

std::unique_ptr<Topology> make_fake_topology(int nodes, const Topology& base) {
  if (nodes < 1) nodes = 1;
  std::vector<int> all;
  for (int n = 0; n < base.num_nodes(); ++n) all.insert(all.end(), base.cpus(n).begin(), base.cpus(n).end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const int64_t c = static_cast<int64_t>(all.size());
  std::vector<int> ids(static_cast<size_t>(nodes));
  std::vector<std::vector<int>> cpus(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n) {
    ids[static_cast<size_t>(n)] = n;
    const int64_t lo = n * c / nodes, hi = (n + 1) * c / nodes;
    cpus[static_cast<size_t>(n)].assign(all.begin() + lo, all.begin() + hi);
  }
  return std::make_unique<ConcreteTopology>("fake:" + std::to_string(nodes), true, std::move(ids),
                                            std::move(cpus));
}

const char* topology_names() { return "sysfs (alias auto), fake:2, fake:4, fake:8"; }

std::unique_ptr<Topology> select_topology(const std::string& name, std::string* error) {
  if (name == "sysfs" || name == "auto") return make_sysfs_topology();
  if (name.compare(0, 5, "fake:") == 0) {
    int n = 0;
    if (parse_int(name.substr(5), &n) && (n == 2 || n == 4 || n == 8)) {
      const auto real = make_sysfs_topology();
      return make_fake_topology(n, *real);
    }
  }
  if (error) *error = "unknown NUMA topology '" + name + "' (expected one of: " + topology_names() + ")";
  return nullptr;
}

std::string topology_name_from_env() {
  const char* v = std::getenv("HINAMOE_NUMA_TOPOLOGY");
  return (v && *v) ? std::string(v) : std::string("sysfs");
}

}  // namespace numa
}  // namespace hinamoe
