#include "cuda/shared_library.hpp"

#include <dlfcn.h>
#include <link.h>

namespace attntune::cuda {

SharedLibrary SharedLibrary::open(const std::string& name, std::string* why) {
  SharedLibrary lib;
  lib.name_ = name;
  dlerror();  // clear any stale message
  lib.handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib.handle_ && why) {
    const char* e = dlerror();
    *why = e ? e : (name + ": cannot be loaded");
  }
  return lib;
}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& o) noexcept {
  if (this != &o) {
    if (handle_) dlclose(handle_);
    handle_ = o.handle_;
    name_ = std::move(o.name_);
    o.handle_ = nullptr;
  }
  return *this;
}

SharedLibrary::~SharedLibrary() {
  if (handle_) dlclose(handle_);
}

std::string SharedLibrary::path() const {
  link_map* map = nullptr;
  if (handle_ && dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name &&
      *map->l_name)
    return map->l_name;
  return name_;
}

void* SharedLibrary::symbol(const char* sym) const noexcept {
  return handle_ ? dlsym(handle_, sym) : nullptr;
}

}  // namespace attntune::cuda
