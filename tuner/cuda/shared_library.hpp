// A dlopen()ed library. The CUDA driver and NVRTC are loaded at run time (never linked) so the
// binary starts on machines with neither; see driver.hpp and nvrtc.hpp.
#pragma once
#include <string>

namespace attntune::cuda {

class SharedLibrary {
 public:
  SharedLibrary() = default;
  // dlopen(name, RTLD_NOW | RTLD_LOCAL). On failure the library is empty and *why (if given)
  // holds dlerror()'s text.
  static SharedLibrary open(const std::string& name, std::string* why = nullptr);

  SharedLibrary(SharedLibrary&& o) noexcept : handle_(o.handle_), name_(std::move(o.name_)) {
    o.handle_ = nullptr;
  }
  SharedLibrary& operator=(SharedLibrary&& o) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary();  // dlclose, unless leak() was called

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  const std::string& name() const noexcept { return name_; }
  // The loaded file's path (from dlinfo), or name() when it cannot be told.
  std::string path() const;
  void* symbol(const char* sym) const noexcept;  // nullptr when absent

  // Keeps the library loaded for the life of the process. The driver and NVRTC are never
  // unloaded: static destructors that run at exit (a Context, a DeviceBuffer) may still call
  // into them, in an order nobody controls.
  void leak() noexcept { handle_ = nullptr; }

 private:
  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace attntune::cuda
