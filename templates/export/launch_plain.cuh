// ---- templates/export/launch_plain.cuh: launching a kernel whose one argument is AttnParams
// (flash_fwd_mma): nothing to add to the launcher's shared checks.
namespace attntune_export {

template <class Params>
int launch_plain(const Kernel& kernel, const Args& a, const Device& device, cudaStream_t stream) {
  Params p = make_params<Params>(a);
  void* params[] = {&p};
  return launch_kernel(kernel, a, device, params, stream);
}

}  // namespace attntune_export
