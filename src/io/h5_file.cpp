// HDF5 files (h5.hpp, File): the access properties of a serial or an MPI-IO file, create, open,
// flush, close.
#include "io/h5.hpp"

namespace meshmoe::h5 {

namespace {
PropList file_access(MPI_Comm comm, const std::string& ctx) {
  PropList fapl(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 7)
  // No POSIX lock, so h5py can read metrics.h5 while the run appends to it.
  check(H5Pset_file_locking(fapl.id(), false, true), ctx + ": H5Pset_file_locking");
#endif
  // Weak close: the file really closes when its last open object does, so a Dataset or Group
  // may outlive its File handle (the MPI-IO driver's default, "semi", would refuse the close
  // and leave a broken file behind).
  check(H5Pset_fclose_degree(fapl.id(), H5F_CLOSE_WEAK), ctx + ": H5Pset_fclose_degree");
  if (comm != MPI_COMM_NULL) {
    check(H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL), ctx + ": H5Pset_fapl_mpio");
    check(H5Pset_all_coll_metadata_ops(fapl.id(), true), ctx + ": H5Pset_all_coll_metadata_ops");
    check(H5Pset_coll_metadata_write(fapl.id(), true), ctx + ": H5Pset_coll_metadata_write");
  }
  return fapl;
}
}  // namespace

File File::create(const std::string& path) { return create(path, MPI_COMM_NULL); }

File File::open(const std::string& path, Access access) { return open(path, MPI_COMM_NULL, access); }

File File::create(const std::string& path, MPI_Comm comm) {
  init_errors();
  std::string ctx = path + ": cannot create";
  PropList fapl = file_access(comm, ctx);
  hid_t f = static_cast<hid_t>(check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()), ctx));
  return File(f, path, comm);
}

File File::open(const std::string& path, MPI_Comm comm, Access access) {
  init_errors();
  std::string ctx = path + ": cannot open" + (access == Access::ReadWrite ? " for writing" : "");
  PropList fapl = file_access(comm, ctx);
  unsigned flags = access == Access::ReadWrite ? H5F_ACC_RDWR : H5F_ACC_RDONLY;
  hid_t f = static_cast<hid_t>(check(H5Fopen(path.c_str(), flags, fapl.id()), ctx));
  return File(f, path, comm);
}

void File::flush() { check(H5Fflush(id(), H5F_SCOPE_GLOBAL), where("H5Fflush")); }

void File::close() {
  if (!valid()) return;
  hid_t f = release();
  check(H5Fclose(f), file_ + ": H5Fclose");
}

}  // namespace meshmoe::h5
