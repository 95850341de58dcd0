"""How NVML's energy counter behaves on this GPU: the cost of a read, how often the counter moves,
and the mean power it gives against nvmlDeviceGetPowerUsage, idle and under a copy load.
`twell bench model` measures energy as it does (GpuMeter in bench/gpu_meter.cpp) because of
what this printed on the H200 (bench/results/h200/nvml_probe.txt): a read takes ~4 ms and the counter
moves every 100 ms.

    python3 bench/micro/nvml_energy_probe.py      (needs PyTorch with CUDA and the NVIDIA driver)
"""
import ctypes, time, threading, sys
import torch
nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()
h = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
def energy():
    v = ctypes.c_ulonglong(); nv.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(v)); return v.value
def power():
    v = ctypes.c_uint(); nv.nvmlDeviceGetPowerUsage(h, ctypes.byref(v)); return v.value
# call latency
t=time.perf_counter(); 
for _ in range(200): energy()
print("energy call us %.1f" % ((time.perf_counter()-t)/200*1e6))
t=time.perf_counter()
for _ in range(200): power()
print("power call us %.1f" % ((time.perf_counter()-t)/200*1e6))
# load: a memory-bound loop (copies) in a thread-free way: enqueue lots of work then poll
a = torch.empty(512*1024*1024//2, dtype=torch.bfloat16, device='cuda'); b = torch.empty_like(a)
def load(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20): b.copy_(a)
        torch.cuda.synchronize()
for mode in ("idle", "copy"):
    samples = []
    stop = time.perf_counter() + 1.5
    th = threading.Thread(target=load, args=(1.6,)) if mode == "copy" else None
    if th: th.start()
    last = energy(); t0 = time.perf_counter(); samples.append((0.0, last))
    while time.perf_counter() < stop:
        e = energy()
        if e != last:
            samples.append((time.perf_counter() - t0, e)); last = e
    if th: th.join()
    d = [(samples[i][0]-samples[i-1][0], samples[i][1]-samples[i-1][1]) for i in range(1, len(samples))]
    print(mode, "moves", len(d), "intervals ms", [round(x*1e3,1) for x,_ in d[:25]])
    print(mode, "deltas mJ", [y for _,y in d[:25]])
    if len(samples) > 2:
        print(mode, "mean power from counter W %.1f" % ((samples[-1][1]-samples[1][1]) / (samples[-1][0]-samples[1][0]) / 1e3), "power reading W", power()/1e3)
