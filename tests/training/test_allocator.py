"""training/allocator.py: after keep_freed_memory() a large tensor comes from the heap, not from
a fresh mmap, and a freed one is reused rather than unmapped. Run in a child process: the setting
is process-wide."""

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import ctypes, json, sys
    import torch
    from opencomposer.training.allocator import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    def mmapped_blocks_while_holding():
        x = torch.ones(2020, 4096)   # 33 MB, above glibc's largest mmap threshold
        held = libc.mallinfo2().hblks
        del x
        return held

    before = mmapped_blocks_while_holding() - libc.mallinfo2().hblks
    applied = keep_freed_memory() and keep_freed_memory()
    after = mmapped_blocks_while_holding() - libc.mallinfo2().hblks
    kept = libc.mallinfo2().fordblks          # free bytes kept in the heap after the del
    print(json.dumps({"before": before, "applied": applied, "after": after, "kept": kept}))
""")


def test_large_tensors_come_from_the_heap_once_applied():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["before"] == 1, r   # glibc's default: the 33 MB tensor was its own mmap
    assert r["applied"] is True
    assert r["after"] == 0, r    # now from the heap
    assert r["kept"] >= 2020 * 4096 * 4, r  # and still there after the free, for the next step
