// Keeps the gpu_worker library non-empty until the GPU expert pool lands.
namespace tandem {
const char* GpuWorkerBuildInfo() { return "no GPU expert pool in this build"; }
}  // namespace tandem
