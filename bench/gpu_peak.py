#!/usr/bin/env python3
"""The GPU's ceilings for `make bench-gpu` (bench/gpu.sh), measured through PyTorch on the GPU the
benchmark runs on: cuBLAS GEMM rates (torch.matmul, n x n x n on random data, median of CUDA-event
timed repeats after a warm-up) in bf16 (fp32 accumulation), fp32 without TF32 (meshmoe's fp32 path)
and TF32; and the device-to-device copy bandwidth (bytes read plus bytes written).
Prints one line per ceiling: `ceiling <what> <value> <unit>`."""
import statistics

import torch


def timed_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def gemm_tflops(n, dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    x = [torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(3)]  # rotate: not one cached input
    y = torch.randn(n, n, device="cuda", dtype=dtype)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    i = [0]

    def step():
        torch.matmul(x[i[0] % 3], y, out=out)
        i[0] += 1
    return 2 * n**3 / timed_ms(step) / 1e9


def main():
    print(f"gpu {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}")
    for n in (4096, 8192):
        print(f"ceiling gemm_bf16_n{n} {gemm_tflops(n, torch.bfloat16, False):.1f} TFLOP/s")
    print(f"ceiling gemm_fp32_n8192 {gemm_tflops(8192, torch.float32, False):.1f} TFLOP/s")
    print(f"ceiling gemm_tf32_n8192 {gemm_tflops(8192, torch.float32, True):.1f} TFLOP/s")
    src = torch.randn(1 << 30, device="cuda")  # 4 GiB
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), reps=10)
    print(f"ceiling copy_d2d {2 * src.numel() * 4 / (ms / 1e3) / 1e9:.0f} GB/s")


if __name__ == "__main__":
    main()
