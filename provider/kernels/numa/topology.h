// NUMA topology: which nodes exist and which CPUs belong to each.
//
// Two implementations behind one interface:
//   * "sysfs"  - the machine's real topology, read from
//                /sys/devices/system/node/node<i>/cpulist. When that
//                directory is absent (non-Linux, containers without sysfs),
//                one node holding every configured CPU.
//   * "fake:N" - N in {2, 4, 8}: the real CPUs (sorted) split into N
//                contiguous BLOCKS: node n gets the CPUs at positions
//                [floor(n*C/N), floor((n+1)*C/N)) of the sorted list of C
//                CPUs. With fewer CPUs than nodes some fake nodes have no
//                CPUs; their work must still be scheduled (a partition is a
//                split of work, not a filter on threads).
// Node indices are dense, 0..num_nodes()-1; os_node_id() gives the kernel's
// id (sysfs can skip numbers, e.g. node0 and node2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hinamoe {
namespace numa {

class Topology {
 public:
  virtual ~Topology() = default;

  // "sysfs" or "fake:N".
  const std::string& name() const { return name_; }
  int num_nodes() const { return static_cast<int>(cpus_.size()); }
  // True for a simulated topology: pages are then modelled as interleaved,
  // never queried from the kernel.
  bool is_fake() const { return fake_; }
  // Kernel node id of dense node `node` (identity for fake topologies).
  int os_node_id(int node) const { return os_ids_[static_cast<size_t>(node)]; }
  // Dense index of kernel node id `os_id`, or -1 when not part of this topology.
  int node_index_of_os_id(int os_id) const;
  // CPUs of dense node `node`, sorted ascending.
  const std::vector<int>& cpus(int node) const { return cpus_[static_cast<size_t>(node)]; }
  // Dense node of `cpu`; 0 when the CPU is unknown (offline, out of range).
  int node_of_cpu(int cpu) const;
  // Node the calling thread runs on now (sched_getcpu() mapped through
  // node_of_cpu); 0 when the CPU cannot be determined. A thread can migrate
  // right after the call: use the answer as a hint for locality only.
  int current_node() const;

 protected:
  Topology(std::string name, bool fake, std::vector<int> os_ids, std::vector<std::vector<int>> cpus);

 private:
  std::string name_;
  bool fake_ = false;
  std::vector<int> os_ids_;
  std::vector<std::vector<int>> cpus_;
  std::vector<int> cpu_to_node_;  // indexed by cpu id, -1 = unknown
};

// Parses a Linux cpulist ("0-3,8-11", "5", "" -> empty). Returns false on
// malformed text (then *out is unspecified).
bool parse_cpulist(const std::string& text, std::vector<int>* out);

// The real topology read from `root` (default /sys/devices/system/node);
// falls back to one node with CPUs 0..nprocs-1 when no node<i>/cpulist is
// readable there.
std::unique_ptr<Topology> make_sysfs_topology(const std::string& root = "/sys/devices/system/node");

// `nodes` fake nodes splitting the CPUs of `base` into blocks (see above).
std::unique_ptr<Topology> make_fake_topology(int nodes, const Topology& base);

// "sysfs" (alias "auto") or "fake:2" / "fake:4" / "fake:8". On a bad name
// returns nullptr and sets *error (when error is non-null).
std::unique_ptr<Topology> select_topology(const std::string& name, std::string* error);

// Names accepted by select_topology, for messages and --help.
const char* topology_names();

// The topology name requested by the environment: $HINAMOE_NUMA_TOPOLOGY,
// or "sysfs" when unset/empty. (The EP option, when given, wins over this.)
std::string topology_name_from_env();

}  // namespace numa
}  // namespace hinamoe
