#!/usr/bin/env python3
"""Usage: peak-rss.py PID

Samples every 50 ms the resident memory of PID and all its descendants
(summed, from /proc) until PID ends; prints the peak in KiB. One process
reading /proc, so that measuring does not take a core from what is measured
(a shell loop forks hundreds of processes a second).
"""
import os
import sys
import time


def children(pid):
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except OSError:
        pass
    return kids


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss(root):
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss_kib(pid)
        todo.extend(children(pid))
    return total


def running(pid):
    """Whether PID exists and is not a zombie (its parent reaps it later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    root = int(sys.argv[1])
    peak = 0
    while running(root):
        peak = max(peak, tree_rss(root))
        time.sleep(0.05)
    print(peak)


if __name__ == "__main__":
    main()
