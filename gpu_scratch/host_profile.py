import cProfile, pstats, sys, time, io
import torch, ember
from ember.bench import zoo
name = sys.argv[1]
model, inputs = zoo.build_model(name, torch.device("cuda"), dtype=torch.bfloat16)
for dyn in (False, True):
    ember.reset()
    with torch.no_grad():
        f = ember.compile(model, dynamic=dyn or None) if not dyn else ember.compile(model, dynamic=True)
        for _ in range(5):
            f(*inputs)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            f(*inputs)
        host = (time.perf_counter() - t) / 20
        torch.cuda.synchronize()
        print(f"== {name} dynamic={dyn}: host {host*1e3:.2f} ms/call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            f(*inputs)
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        print("\n".join(l[:170] for l in s.getvalue().splitlines()[:45]))
