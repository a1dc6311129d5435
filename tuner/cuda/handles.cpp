// RAII handles over the lazily loaded driver (driver.hpp). Constructors and methods throw
// CudaError; destructors ignore failures (a poisoned context fails every call, and there is nothing
// a destructor could do about it) and never load the driver.
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "cuda/driver.hpp"

namespace attntune::cuda {

// ---- Context ------------------------------------------------------------------------------------

Context::Context(int ordinal) {
  const Driver& d = driver();
  detail::check_device_ordinal(ordinal);
  CUdevice dev = 0;
  CU_CHECK(d.cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  CU_CHECK(d.cuDevicePrimaryCtxRetain(&ctx, dev));
  ordinal_ = ordinal;
  device_ = dev;
  ctx_ = ctx;
  try {
    make_current();
  } catch (...) {
    reset();  // a throwing constructor runs no destructor
    throw;
  }
}

void Context::reset() noexcept {
  if (ctx_) {
    if (const Driver* d = detail::loaded_driver()) d->cuDevicePrimaryCtxRelease(device_);
  }
  ctx_ = nullptr;
  ordinal_ = -1;
  device_ = 0;
}

Context::~Context() { reset(); }

Context::Context(Context&& o) noexcept : ordinal_(o.ordinal_), device_(o.device_), ctx_(o.ctx_) {
  o.ctx_ = nullptr;
  o.ordinal_ = -1;
}

Context& Context::operator=(Context&& o) noexcept {
  if (this != &o) {
    reset();
    ordinal_ = o.ordinal_;
    device_ = o.device_;
    ctx_ = o.ctx_;
    o.ctx_ = nullptr;
    o.ordinal_ = -1;
  }
  return *this;
}

void Context::make_current() const { CU_CHECK(driver().cuCtxSetCurrent(ctx_)); }

void Context::synchronize() const { CU_CHECK(driver().cuCtxSynchronize()); }

std::size_t Context::limit(CUlimit which) const {
  std::size_t v = 0;
  CU_CHECK(driver().cuCtxGetLimit(&v, which));
  return v;
}

void Context::set_limit(CUlimit which, std::size_t value) const {
  CU_CHECK(driver().cuCtxSetLimit(which, value));
}

Context::MemInfo Context::mem_info() const {
  MemInfo m;
  CU_CHECK(driver().cuMemGetInfo(&m.free, &m.total));
  return m;
}

// ---- Function -----------------------------------------------------------------------------------

int Function::attribute(CUfunction_attribute a) const {
  int v = 0;
  CU_CHECK(driver().cuFuncGetAttribute(&v, a, f_));
  return v;
}

void Function::set_attribute(CUfunction_attribute a, int value) const {
  const CUresult r = driver().cuFuncSetAttribute(f_, a, value);
  if (r != CUDA_SUCCESS)
    throw_cuda_error(r, fmt::format("cuFuncSetAttribute({}, attribute {}, {})", name_,
                                    static_cast<int>(a), value));
}

int Function::max_active_blocks_per_sm(int block_threads, std::size_t dynamic_smem) const {
  int blocks = 0;
  CU_CHECK(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f_, block_threads,
                                                                dynamic_smem));
  return blocks;
}

int Function::max_active_clusters(Dim3 grid, int block_threads, std::size_t dynamic_smem) const {
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = static_cast<unsigned>(block_threads);
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = static_cast<unsigned>(dynamic_smem);
  int clusters = 0;
  CU_CHECK(driver().cuOccupancyMaxActiveClusters(&clusters, f_, &config));
  return clusters;
}

// ---- Module -------------------------------------------------------------------------------------

Module::Module(const std::string& image) {
  const Driver& d = driver();
  // The JIT error log says what is wrong with PTX the driver compiles, and for a CUBIN why it does
  // not fit this device.
  constexpr unsigned kLogBytes = 16 * 1024;
  std::string error_log(kLogBytes, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(),
                    reinterpret_cast<void*>(static_cast<std::uintptr_t>(kLogBytes))};
  CUmodule m = nullptr;
  const CUresult r = d.cuModuleLoadDataEx(&m, image.data(), 2, options, values);
  if (r != CUDA_SUCCESS) {
    error_log.resize(std::min<std::size_t>(error_log.find('\0'), error_log.size()));
    throw_cuda_error(r, fmt::format("cuModuleLoadDataEx({}-byte image)", image.size()), error_log);
  }
  m_ = m;
}

Module::~Module() {
  if (m_) {
    if (const Driver* d = detail::loaded_driver()) d->cuModuleUnload(m_);
  }
}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    if (m_) {
      if (const Driver* d = detail::loaded_driver()) d->cuModuleUnload(m_);
    }
    m_ = o.m_;
    o.m_ = nullptr;
  }
  return *this;
}

Function Module::function(const std::string& name) const {
  CUfunction f = nullptr;
  const CUresult r = driver().cuModuleGetFunction(&f, m_, name.c_str());
  if (r != CUDA_SUCCESS) throw_cuda_error(r, fmt::format("cuModuleGetFunction(\"{}\")", name));
  return Function(f, name);
}

DeviceSymbol Module::global(const std::string& name) const {
  DeviceSymbol s;
  const CUresult r = driver().cuModuleGetGlobal(&s.ptr, &s.bytes, m_, name.c_str());
  if (r != CUDA_SUCCESS) throw_cuda_error(r, fmt::format("cuModuleGetGlobal(\"{}\")", name));
  return s;
}

// ---- DeviceBuffer -------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  CUdeviceptr p = 0;
  const CUresult r = driver().cuMemAlloc(&p, bytes);
  if (r != CUDA_SUCCESS) throw_cuda_error(r, fmt::format("cuMemAlloc({} bytes)", bytes));
  ptr_ = p;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) {
    if (const Driver* d = detail::loaded_driver()) d->cuMemFree(ptr_);
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) {
      if (const Driver* d = detail::loaded_driver()) d->cuMemFree(ptr_);
    }
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::check_range(std::size_t bytes, std::size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw std::out_of_range(fmt::format("DeviceBuffer: {} bytes at offset {} exceed its {} bytes",
                                        bytes, offset, bytes_));
}

std::size_t DeviceBuffer::count_of(std::size_t elem) const {
  if (bytes_ % elem != 0)
    throw std::out_of_range(
        fmt::format("DeviceBuffer: {} bytes is not a whole number of {}-byte values", bytes_, elem));
  return bytes_ / elem;
}

void DeviceBuffer::upload(const void* src, std::size_t bytes, std::size_t offset) {
  check_range(bytes, offset);
  if (bytes) CU_CHECK(driver().cuMemcpyHtoD(ptr_ + offset, src, bytes));
}

void DeviceBuffer::download(void* dst, std::size_t bytes, std::size_t offset) const {
  check_range(bytes, offset);
  if (bytes) CU_CHECK(driver().cuMemcpyDtoH(dst, ptr_ + offset, bytes));
}

void DeviceBuffer::upload_async(const void* src, std::size_t bytes, CUstream stream,
                                std::size_t offset) {
  check_range(bytes, offset);
  if (bytes) CU_CHECK(driver().cuMemcpyHtoDAsync(ptr_ + offset, src, bytes, stream));
}

void DeviceBuffer::download_async(void* dst, std::size_t bytes, CUstream stream,
                                  std::size_t offset) const {
  check_range(bytes, offset);
  if (bytes) CU_CHECK(driver().cuMemcpyDtoHAsync(dst, ptr_ + offset, bytes, stream));
}

void DeviceBuffer::copy_from(const DeviceBuffer& src, std::size_t bytes) {
  check_range(bytes, 0);
  src.check_range(bytes, 0);
  if (bytes) CU_CHECK(driver().cuMemcpyDtoD(ptr_, src.ptr_, bytes));
}

void DeviceBuffer::copy_from_async(const DeviceBuffer& src, std::size_t bytes, CUstream stream) {
  check_range(bytes, 0);
  src.check_range(bytes, 0);
  if (bytes) CU_CHECK(driver().cuMemcpyDtoDAsync(ptr_, src.ptr_, bytes, stream));
}

void DeviceBuffer::fill_u8(std::uint8_t value) {
  if (bytes_) CU_CHECK(driver().cuMemsetD8(ptr_, value, bytes_));
}
void DeviceBuffer::fill_u16(std::uint16_t value) {
  const std::size_t n = count_of(2);
  if (n) CU_CHECK(driver().cuMemsetD16(ptr_, value, n));
}
void DeviceBuffer::fill_u32(std::uint32_t value) {
  const std::size_t n = count_of(4);
  if (n) CU_CHECK(driver().cuMemsetD32(ptr_, value, n));
}
void DeviceBuffer::fill_u8_async(std::uint8_t value, CUstream stream) {
  if (bytes_) CU_CHECK(driver().cuMemsetD8Async(ptr_, value, bytes_, stream));
}
void DeviceBuffer::fill_u16_async(std::uint16_t value, CUstream stream) {
  const std::size_t n = count_of(2);
  if (n) CU_CHECK(driver().cuMemsetD16Async(ptr_, value, n, stream));
}
void DeviceBuffer::fill_u32_async(std::uint32_t value, CUstream stream) {
  const std::size_t n = count_of(4);
  if (n) CU_CHECK(driver().cuMemsetD32Async(ptr_, value, n, stream));
}

// ---- Stream and Event ---------------------------------------------------------------------------

Stream::Stream(unsigned flags) { CU_CHECK(driver().cuStreamCreate(&s_, flags)); }

Stream::~Stream() {
  if (s_) {
    if (const Driver* d = detail::loaded_driver()) d->cuStreamDestroy(s_);
  }
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) {
      if (const Driver* d = detail::loaded_driver()) d->cuStreamDestroy(s_);
    }
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

void Stream::synchronize() const { CU_CHECK(driver().cuStreamSynchronize(s_)); }

bool Stream::done() const {
  const CUresult r = driver().cuStreamQuery(s_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  check(r, "cuStreamQuery(stream)");
  return true;
}

Event::Event(unsigned flags) { CU_CHECK(driver().cuEventCreate(&e_, flags)); }

Event::~Event() {
  if (e_) {
    if (const Driver* d = detail::loaded_driver()) d->cuEventDestroy(e_);
  }
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) {
      if (const Driver* d = detail::loaded_driver()) d->cuEventDestroy(e_);
    }
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

void Event::record(CUstream stream) { CU_CHECK(driver().cuEventRecord(e_, stream)); }

void Event::synchronize() const { CU_CHECK(driver().cuEventSynchronize(e_)); }

Graph::Graph(CUstream stream, const std::function<void()>& record) {
  const Driver& d = driver();
  CU_CHECK(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUgraph graph = nullptr;
  try {
    record();
  } catch (...) {
    if (d.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS && graph) d.cuGraphDestroy(graph);
    throw;
  }
  CU_CHECK(d.cuStreamEndCapture(stream, &graph));
  const CUresult r = d.cuGraphInstantiate(&exec_, graph, 0);
  d.cuGraphDestroy(graph);
  check(r, "cuGraphInstantiate(&exec, graph, 0)");
}

Graph::~Graph() {
  if (exec_)
    if (const Driver* d = detail::loaded_driver()) d->cuGraphExecDestroy(exec_);
}

void Graph::launch(CUstream stream) const { CU_CHECK(driver().cuGraphLaunch(exec_, stream)); }

float elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  CU_CHECK(driver().cuEventElapsedTime(&ms, start.get(), end.get()));
  return ms;
}

// ---- Launch -------------------------------------------------------------------------------------

void launch(const Function& f, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
            void** args) {
  const CUresult r = driver().cuLaunchKernel(f.get(), grid.x, grid.y, grid.z, block.x, block.y,
                                             block.z, smem_bytes, stream, args, nullptr);
  if (r != CUDA_SUCCESS)
    throw_cuda_error(r, fmt::format("cuLaunchKernel({}, grid ({},{},{}), block ({},{},{}), "
                                    "{} bytes dynamic smem)",
                                    f.name(), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                    smem_bytes));
}

}  // namespace attntune::cuda
