// probe_host_fn_blocking.cu - which CUDA runtime calls block the calling
// thread while a host function (cudaLaunchHostFunc) runs on another stream?
// Each candidate is timed while stream a is held by a 1.5 s sleeping host
// function; also: are host functions of different streams serialised, and
// does "not ready" stay as the thread's last error. The documentation allows
// any call to block ("API synchronization behavior"); this measures what one
// driver does, for the CUDA emulator's hostile choices and for the tests'
// gates. Not part of the build (a real GPU is needed):
//   nvcc -arch=sm_90 -o probe bench/gpu/probe_host_fn_blocking.cu && ./probe
// Results: bench/gpu/h100-2026-11-25-probe.txt, bench/RESULTS.md.
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void CUDART_CB sleeper(void *p){ usleep(1500000); }
__global__ void k(float *x){ x[threadIdx.x] *= 2.f; }
#define T(what, call) do { hold(); double t0=now(); cudaError_t e=(call); double dt=now()-t0; \
  printf("%-40s %-22s %.3f s%s\n", what, cudaGetErrorName(e), dt, dt>1.0?"  <-- BLOCKED by the host function":""); \
  cudaStreamSynchronize(a); cudaGetLastError(); } while(0)
static cudaStream_t a, b;
static void hold(void){ cudaLaunchHostFunc(a, sleeper, NULL); usleep(100000); }
int main(void){
  cudaSetDevice(0);
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  float *d, *d2, *pin, host[256]; void *t;
  cudaMalloc(&d, 1<<20); cudaHostAlloc((void**)&pin, 1024, 0);
  cudaEvent_t ev; cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  T("cudaMalloc 8 KiB", cudaMalloc(&d2, 8192));
  T("cudaFree", cudaFree(d2));
  T("cudaMalloc 64 MiB", cudaMalloc(&d2, 64<<20));
  T("cudaFree 64 MiB", cudaFree(d2));
  T("cudaMallocAsync first (b)", cudaMallocAsync(&t, 4096, b));
  T("cudaFreeAsync (b)", cudaFreeAsync(t, b));
  T("cudaMallocAsync again (b)", cudaMallocAsync(&t, 4096, b));
  T("cudaFreeAsync again (b)", cudaFreeAsync(t, b));
  T("cudaMemcpyAsync pageable H2D (b)", cudaMemcpyAsync(d, host, 1024, cudaMemcpyHostToDevice, b));
  T("cudaMemcpyAsync pageable D2H (b)", cudaMemcpyAsync(host, d, 1024, cudaMemcpyDeviceToHost, b));
  T("cudaMemcpyAsync pinned D2H (b)", cudaMemcpyAsync(pin, d, 1024, cudaMemcpyDeviceToHost, b));
  T("cudaMemsetAsync (b)", cudaMemsetAsync(d, 0, 1024, b));
  T("kernel launch (b)", (k<<<1,32,0,b>>>(d), cudaGetLastError()));
  T("cudaEventRecord (a)", cudaEventRecord(ev, a));
  T("cudaEventQuery after record on a", (cudaEventRecord(ev, a), cudaEventQuery(ev)));
  T("cudaStreamSynchronize (b)", cudaStreamSynchronize(b));
  T("cudaLaunchHostFunc (b) + sync b", (cudaLaunchHostFunc(b, sleeper, NULL) , cudaSuccess));
  T("cudaHostAlloc", cudaHostAlloc((void**)&t, 4096, 0));
  T("cudaFreeHost", cudaFreeHost(t));
  T("cudaMemGetInfo", ({size_t f,tt; cudaMemGetInfo(&f,&tt);}));
  { hold(); double t0=now(); cudaLaunchHostFunc(b, sleeper, NULL); cudaStreamSynchronize(b);
    printf("%-40s %.3f s (1.5 = concurrent host functions, 3.0 = serialised)\n", "host fn on b after one on a: b done", now()-t0); cudaStreamSynchronize(a);}
  { double t0=now(); cudaLaunchHostFunc(a, sleeper, NULL); cudaLaunchHostFunc(b, sleeper, NULL); cudaStreamSynchronize(a); cudaStreamSynchronize(b);
    printf("%-40s %.3f s (1.5 = concurrent, 3.0 = serialised)\n", "host fns on a and b: both done", now()-t0);}
  { cudaError_t e = cudaEventQuery(ev); (void)e; hold(); cudaEventRecord(ev, a); e = cudaEventQuery(ev);
    printf("cudaEventQuery not ready: %s, cudaGetLastError after: %s\n", cudaGetErrorName(e), cudaGetErrorName(cudaGetLastError())); cudaStreamSynchronize(a);}
  { hold(); cudaError_t e = cudaStreamQuery(a);
    printf("cudaStreamQuery not ready: %s, cudaGetLastError after: %s\n", cudaGetErrorName(e), cudaGetErrorName(cudaGetLastError())); cudaStreamSynchronize(a);}
  return 0;
}
