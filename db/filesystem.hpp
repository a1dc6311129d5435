// Which filesystem holds a database, so that the writers a whole queue depends on (serve, submit,
// tune) refuse a network filesystem (docs/design/service.md, "Network filesystems"). SQLite keeps
// its writers apart with POSIX advisory locks and, in WAL mode, an index mapped in shared memory
// (the -shm file): on NFS, SMB/CIFS and their kind the locks are emulated, lost with a lease or
// not shared between hosts at all, and the mapping is never shared between hosts, so two hosts
// writing one file can corrupt it or lose results (https://sqlite.org/useovernet.html). The
// supported way to use several hosts is a database per host on a local disk and `attntune merge`
// (tools/slurm/).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace attntune {

struct Filesystem {
  std::string type;      // the mount's type as /proc/self/mountinfo names it: "nfs4", "cifs", "fuse.sshfs", "ext4"
                         // ("" when it could not be found out)
  bool network = false;  // is_network_filesystem(type)
};

// The filesystem of `path`: the file's when it exists, else its directory's (a database about to be
// created). From statfs(2)'s f_type, and for FUSE from the mount's subtype in /proc/self/mountinfo
// (sshfs is FUSE, so are local filesystems such as fuse-overlayfs). Test seam: the environment
// variable ATTNTUNE_TEST_FS_TYPE=TYPE (a mountinfo type, such as nfs4 or fuse.sshfs) stands in for
// the probe, since test machines have no NFS.
Filesystem filesystem_of(const std::string& path);

// Whether a mountinfo type names a network or cluster filesystem: nfs, nfs4, cifs, smb3, smbfs,
// ceph, lustre, gpfs, 9p, afs, glusterfs, beegfs, ... and FUSE network clients (fuse.sshfs,
// fuse.glusterfs, fuse.s3fs, fuse.rclone, ...).
bool is_network_filesystem(std::string_view type);

// The mountinfo type of a statfs(2) f_type of a network filesystem ("nfs", "cifs", ...), "fuse"
// for FUSE (its subtype is in mountinfo), "" for any other.
std::string network_filesystem_of_magic(std::uint64_t magic);

}  // namespace attntune
