#include "db/filesystem.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

namespace attntune {

namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kFuseMagic = 0x65735546;

// statfs(2) f_type values (linux/magic.h and the filesystems' own headers) of network and cluster
// filesystems, with their mountinfo type.
constexpr std::array<std::pair<std::uint64_t, const char*>, 18> kNetworkMagics = {{
    {0x6969, "nfs"},          // NFS_SUPER_MAGIC (nfs and nfs4)
    {0x517B, "smbfs"},        // SMB_SUPER_MAGIC
    {0xFF534D42, "cifs"},     // CIFS_SUPER_MAGIC
    {0xFE534D42, "smb3"},     // SMB2_SUPER_MAGIC
    {0x00C36400, "ceph"},     // CEPH_SUPER_MAGIC
    {0x0BD00BD0, "lustre"},   // LL_SUPER_MAGIC
    {0x47504653, "gpfs"},     // GPFS_SUPER_MAGIC (IBM Spectrum Scale)
    {0x01021997, "9p"},       // V9FS_MAGIC
    {0x5346414F, "afs"},      // AFS_SUPER_MAGIC (OpenAFS)
    {0x6B414653, "afs"},      // AFS_FS_MAGIC (kAFS)
    {0x73757245, "coda"},     // CODA_SUPER_MAGIC
    {0x564C, "ncpfs"},        // NCP_SUPER_MAGIC
    {0x7461636F, "ocfs2"},    // OCFS2_SUPER_MAGIC (a disk shared between hosts)
    {0x01161970, "gfs2"},     // GFS2_MAGIC (likewise)
    {0x20030528, "pvfs2"},    // PVFS2 / OrangeFS
    {0x19830326, "beegfs"},   // BeeGFS (FhGFS)
    {0xAAD7AAEA, "panfs"},    // Panasas
    {0x786F4256, "vboxsf"},   // VirtualBox shared folders
}};

// mountinfo types of network filesystems (kernel clients, and FUSE clients after "fuse.").
constexpr std::array<std::string_view, 24> kNetworkTypes = {
    "nfs",    "nfs4",   "cifs",      "smb3",   "smbfs",  "smb",    "ceph",    "lustre",
    "gpfs",   "9p",     "afs",       "coda",   "ncpfs",  "ocfs2",  "gfs2",    "pvfs2",
    "orangefs", "beegfs", "panfs",   "vboxsf", "glusterfs", "davfs", "cvmfs", "quobyte"};
constexpr std::array<std::string_view, 16> kNetworkFuseTypes = {
    "sshfs", "glusterfs", "ceph-fuse", "ceph",    "s3fs",     "gcsfuse",  "rclone", "juicefs",
    "davfs", "mfs",       "lizardfs",  "goofys",  "blobfuse", "blobfuse2", "beegfs", "cvmfs"};

// The type /proc/self/mountinfo gives the mount holding device `dev` ("" if none does):
// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw" (proc(5)).
std::string mountinfo_type(dev_t dev) {
  std::ifstream in("/proc/self/mountinfo");
  const std::string want = fmt::format("{}:{}", major(dev), minor(dev));
  std::string line, found;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno;
    fields >> id >> parent >> devno;
    if (devno != want) continue;
    const std::size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    rest >> found;  // the last mount of the device wins, as the last mounted is what a path sees
  }
  return found;
}

}  // namespace

bool is_network_filesystem(std::string_view type) {
  for (std::string_view t : kNetworkTypes)
    if (type == t) return true;
  constexpr std::string_view kFuse = "fuse.";
  if (type.substr(0, kFuse.size()) == kFuse) {
    const std::string_view sub = type.substr(kFuse.size());
    for (std::string_view t : kNetworkFuseTypes)
      if (sub == t) return true;
  }
  return false;
}

std::string network_filesystem_of_magic(std::uint64_t magic) {
  if (magic == kFuseMagic) return "fuse";
  for (const auto& [m, name] : kNetworkMagics)
    if (m == magic) return name;
  return "";
}

Filesystem filesystem_of(const std::string& path) {
  Filesystem out;
  if (const char* seam = std::getenv("ATTNTUNE_TEST_FS_TYPE"); seam && *seam) {
    out.type = seam;
    out.network = is_network_filesystem(out.type);
    return out;
  }
  std::error_code ec;
  fs::path target = path;
  if (!fs::exists(target, ec)) target = fs::absolute(target, ec).parent_path();
  struct statfs sfs {};
  struct stat st {};
  if (::statfs(target.c_str(), &sfs) != 0 || ::stat(target.c_str(), &st) != 0) return out;  // said by the open
  const std::string by_magic = network_filesystem_of_magic(static_cast<std::uint64_t>(sfs.f_type));
  out.type = mountinfo_type(st.st_dev);
  if (out.type.empty() || (by_magic != "fuse" && !by_magic.empty() && !is_network_filesystem(out.type)))
    out.type = by_magic;  // the magic is the kernel's word for it; mountinfo only adds FUSE's subtype
  out.network = (!by_magic.empty() && by_magic != "fuse") || is_network_filesystem(out.type);
  return out;
}

}  // namespace attntune
