# Joins nvidia-smi samples ("epoch seconds, power W, SM MHz, throttle reasons" per line) with the
# MARK start/end lines of a log: median power and SM clock per marked interval (its first 0.3 s dropped).
import statistics
import sys
samples = []
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.split(",")]
    try: samples.append((float(p[0]), float(p[1]), float(p[2]), p[3]))
    except (ValueError, IndexError): pass
marks = {}
for line in open(sys.argv[2]):
    if line.startswith("MARK "):
        w = line.split()
        marks.setdefault(w[1], {})[w[2]] = float(w[3])
        if w[2] == "end": marks[w[1]]["rest"] = " ".join(w[4:])
for name, m in marks.items():
    if "start" not in m or "end" not in m: continue
    s = [x for x in samples if m["start"] + 0.3 <= x[0] <= m["end"]]
    if not s: print(f"POWER {name}: no samples"); continue
    reasons = sorted({x[3] for x in s})
    watts, mhz = statistics.median(x[1] for x in s), statistics.median(x[2] for x in s)
    print(f"POWER {name:34s} {watts:6.1f} W  {mhz:6.0f} MHz  n={len(s)} throttle={reasons} {m.get('rest', '')}")
