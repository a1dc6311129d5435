// `attntune merge A.db B.db ... -o OUT.db` (docs/design/merge.md): each host of a multi-host run keeps
// its own database on its local disk; merge combines them into one, without duplicates and without
// losing anything. Content-addressed, so merging an input again adds nothing: devices by (name, arch,
// uuid), candidates by (family, config_key, source_hash), builds by (source_hash, arch, nvrtc_version,
// options), campaigns by name and their evaluations by sequence, the queue by campaign name, gpus by
// (host, ordinal). Leases are host-local and never merged.
//
// The inputs are read, never written: each is opened as `best` opens a database (Store::Mode::kReadOnly:
// an older schema is migrated in a private in-memory copy) and read in one read transaction, so a
// `serve` writing it is never blocked. Everything written to OUT is written in one transaction.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attntune {

class Store;

// A campaign of an input stored in OUT under another name: its name in OUT was taken by a campaign
// with other evaluations (two hosts both ran it), or another problem or search space.
struct MergeRename {
  std::string campaign;  // its name in the input
  std::string stored_as; // its name in OUT: NAME@<input file stem> (then .2, .3, ... if that is taken)
  std::string reason;
};

// What one input brought to OUT.
struct MergeCounts {
  std::string input;  // the path as given
  std::int64_t campaigns_added = 0;     // new to OUT, copied whole
  std::int64_t campaigns_extended = 0;  // OUT held a prefix of it: the rest, its state and ranking added
  std::int64_t campaigns_same = 0;      // OUT holds it already (the same evaluations, or more)
  std::int64_t campaigns_renamed = 0;   // imported under a new name (`renamed` says which)
  std::vector<MergeRename> renamed;
  std::int64_t evaluations_added = 0;
  std::int64_t rankings_added = 0;  // ranking rows written (a campaign's ranking replaced counts its rows)
  std::int64_t candidates_added = 0;
  std::int64_t devices_added = 0;
  std::int64_t builds_added = 0;
  std::int64_t builds_replaced = 0;  // OUT's failed build replaced by the input's ok one
  std::int64_t queue_added = 0;
  std::int64_t queue_updated = 0;  // a state further along (done > failed > running > queued) or more attempts
  std::int64_t gpus_updated = 0;   // added, or a newer updated_at

  bool nothing_added() const {
    return campaigns_added + campaigns_extended + campaigns_renamed + evaluations_added + rankings_added +
               candidates_added + devices_added + builds_added + builds_replaced + queue_added + queue_updated +
               gpus_updated ==
           0;
  }
};

// One input, opened (kReadOnly), for Store::merge_from.
struct MergeSource {
  std::string path;  // as given, for messages and the report
  std::string stem;  // the file name without its extension: the suffix of renamed campaigns
  Store* store = nullptr;
};

// Progress lines (stderr in the CLI).
using MergeProgress = std::function<void(const std::string& line)>;

// Merges `inputs` into the database `out` (created if missing, migrated if older), in order, in one
// write transaction. Before anything touches `out` it refuses (InputError, `out` left byte for byte as
// it was): no inputs; `out` being one of the inputs (the same file by device and inode, whatever the
// name); an input that is missing, not an attntune database, corrupt, or of a newer schema than this
// binary's. Returns one MergeCounts per input, in order.
std::vector<MergeCounts> merge_databases(const std::vector<std::string>& inputs, const std::string& out,
                                         const MergeProgress& progress = {});

}  // namespace attntune
