# A Python program whose live objects move between size bands: 60,000 `bytes` objects, each
# step replacing a random one, with lengths in five bands (1..40, 100..900, 16..64, 1000..9000
# and 1..20000 B), three times, 150,000 steps per band. Python serves objects up to 512 B from
# its own arenas, so what reaches malloc swings from about 600 MB in use to a few MB and back
# every few seconds while the program stays busy (docs/MEMORY.md, "A program whose pages swing
# while it stays busy"; bench/workloads/swing is the same shape in C++).
#
#   /usr/bin/time -f '%e s %U user %S sys %R faults %M KB' \
#       env LD_PRELOAD=build/lib/libtraymalloc.so python3 bench/scripts/size_bands.py
#
# Checks every object it replaces; prints a digest of them, the same under every allocator.
import hashlib
import random

random.seed(1)
live = []
digest = hashlib.sha256()
for lo, hi in [(1, 40), (100, 900), (16, 64), (1000, 9000), (1, 20000)] * 3:
    for step in range(150000):
        n = random.randint(lo, hi)
        s = bytes([step % 251]) * n
        if len(live) < 60000:
            live.append(s)
            continue
        i = random.randrange(len(live))
        old = live[i]
        assert old == bytes([old[0]]) * len(old)
        digest.update(old[:8])
        live[i] = s
print(digest.hexdigest()[:16], len(live))
