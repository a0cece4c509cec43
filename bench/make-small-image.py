#!/usr/bin/env python3
"""Writes a many-small-files image of bench/pull.sh as an OCI layout.

Usage: make-small-image.py FILES LAYOUT_DIR

FILES file entries (regular files and hard links, replacements included) of
1 to 4 KB of text-like data (~2.6x at gzip level 1) over 30 gzip layers, as in Python and
CUDA images: packages of 100 to 600 files in nested folders (a dist-info
folder beside each Python one) under site-packages-, dist-packages-,
include- and locale-like roots, a larger base layer first. Each upper layer
also replaces files of lower layers (2% of its entries), deletes some (1%,
whiteout files), every sixth layer deletes a whole lower package (a whiteout
of its folder) and layers 10 and 20 empty a lower package's subfolder (an
opaque whiteout) and refill it; about 1% of the files are hard links to an
earlier file of their package. One tag, "img". Deterministic: the same
digests each time.

Fast: the tar streams are written directly (ustar headers), compressed with
zlib level 1 as they are written, one layer per core; the file contents are
slices of one word-salad corpus. Prints one JSON line: the counts (files,
links, whiteouts, files in the final tree, directories) and the bytes.
"""
import hashlib
import importlib.util
import json
import multiprocessing
import os
import random
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_image", f"{HERE}/make-image.py")
make_image = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_image)

SEED = 20261203
LAYERS = 30
MTIME = make_image.MTIME
# (root, file name suffix, Python package: with a dist-info folder)
ROOTS = [
    ("usr/lib/python3/dist-packages", ".py", True),
    ("usr/local/lib/python3.11/site-packages", ".py", True),
    ("usr/local/cuda-12.4/targets/x86_64-linux/include", ".h", False),
    ("usr/share/locale", ".mo", False),
]
DIST_INFO = ("METADATA", "RECORD", "WHEEL")
CORPUS = b""  # set in main, before the workers fork
BLOBS = ""  # the layout's blobs/sha256, likewise

_TEMPLATE = bytearray(512)
_TEMPLATE[108:124] = b"0000000\0" * 2  # uid, gid
_TEMPLATE[136:148] = b"%011o\0" % MTIME
_TEMPLATE[257:265] = b"ustar\x0000"
_TEMPLATE[265:269] = _TEMPLATE[297:301] = b"root"
_TEMPLATE[329:345] = b"0000000\0" * 2  # devmajor, devminor


def pkg_dir(p):
    root, _, _ = ROOTS[p % len(ROOTS)]
    return f"{root}/pkg{p:05d}"


def path(p, k):
    """File k of package p."""
    root, ext, py = ROOTS[p % len(ROOTS)]
    if py and k < len(DIST_INFO):
        return f"{root}/pkg{p:05d}-1.0.dist-info/{DIST_INFO[k]}"
    if k < 13:
        return f"{root}/pkg{p:05d}/f{k:04d}{ext}"
    return f"{root}/pkg{p:05d}/{sub(k)}/f{k:04d}{ext}"


def sub(k):
    """The nested folder of file k >= 13 of a package."""
    return f"m{k // 50}/s{(k // 10) % 5}"


class Tar:
    """A tar stream, gzipped as written; sha256 of both."""

    def __init__(self, path):
        self.path = path
        self.out = open(path, "wb")
        self.z = zlib.compressobj(1, zlib.DEFLATED, 31)
        self.diff_id = hashlib.sha256()
        self.digest = hashlib.sha256()
        self.size = 0
        self.raw = 0
        self.buf = []
        self.pending = 0
        self.dirs = set()
        self.count = {"files": 0, "links": 0, "whiteouts": 0, "dirs": 0}

    def _put(self, b):
        self.buf.append(b)
        self.pending += len(b)
        if self.pending >= 1 << 20:
            self._flush()

    def _flush(self):
        data = b"".join(self.buf)
        self.buf, self.pending = [], 0
        self.raw += len(data)
        self.diff_id.update(data)
        self._write(self.z.compress(data))

    def _write(self, c):
        self.digest.update(c)
        self.out.write(c)
        self.size += len(c)

    def _header(self, name, kind, size=0, mode=0o644, link=""):
        n = name.encode()
        assert len(n) <= 100, name
        h = _TEMPLATE[:]
        h[0:len(n)] = n
        h[100:108] = b"%07o\0" % mode
        h[124:136] = b"%011o\0" % size
        h[156] = ord(kind)
        if link:
            h[157:157 + len(link)] = link.encode()
        h[148:156] = b"        "
        h[148:156] = b"%06o\0 " % sum(h)
        self._put(bytes(h))

    def dir(self, name):
        if name in self.dirs:
            return
        parent = name.rpartition("/")[0]
        if parent:
            self.dir(parent)
        self.dirs.add(name)
        self.count["dirs"] += 1
        self._header(name + "/", "5", mode=0o755)

    def file(self, name, data, kind="files"):
        self.dir(name.rpartition("/")[0])
        self.count[kind] += 1
        self._header(name, "0", len(data))
        self._put(data)
        if len(data) % 512:
            self._put(bytes(512 - len(data) % 512))

    def link(self, name, target):
        self.dir(name.rpartition("/")[0])
        self.count["links"] += 1
        self._header(name, "1", link=target)

    def whiteout(self, name):
        d, _, base = name.rpartition("/")
        self.file(f"{d}/.wh.{base}", b"", "whiteouts")

    def close(self):
        self._put(bytes(1024))
        self._flush()
        self._write(self.z.flush())
        self.out.close()


def text(rng):
    n = rng.randint(1024, 4096)
    o = rng.randrange(len(CORPUS) - n)
    return CORPUS[o:o + n]


def write_layer(job):
    """One layer from its plan: (index, ops); returns its descriptor parts."""
    index, ops = job
    rng = random.Random(SEED * 100 + index)
    tar = Tar(f"{BLOBS}/layer{index:02d}.tmp")
    for op in ops:
        kind = op[0]
        if kind == "pkg":  # a new package: ("pkg", p, nfiles)
            _, p, nfiles = op
            last = 0
            for k in range(nfiles):
                if k > 13 and rng.random() < 0.01:
                    tar.link(path(p, k), path(p, last))
                else:
                    tar.file(path(p, k), text(rng))
                    last = k
        elif kind == "replace":  # ("replace", p, k)
            tar.file(path(op[1], op[2]), text(rng))
        elif kind == "delete":  # ("delete", p, k)
            tar.whiteout(path(op[1], op[2]))
        elif kind == "delete-pkg":  # ("delete-pkg", p)
            tar.whiteout(pkg_dir(op[1]))
        elif kind == "opaque":  # ("opaque", p, folder, new files)
            _, p, folder, nnew = op
            d = f"{pkg_dir(p)}/{folder}"
            tar.dir(d)
            tar.file(f"{d}/.wh..wh..opq", b"", "whiteouts")
            for i in range(nnew):
                tar.file(f"{d}/n{i:04d}.py", text(rng))
    tar.close()
    digest = tar.digest.hexdigest()
    os.rename(tar.path, f"{BLOBS}/{digest}")
    desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": f"sha256:{digest}", "size": tar.size}
    return desc, "sha256:" + tar.diff_id.hexdigest(), tar.count, tar.raw


def plan(files):
    """The ops of every layer, and how many files the final tree has."""
    rng = random.Random(SEED)
    weights = [3] + [1] * (LAYERS - 1)
    budgets = [files * w // sum(weights) for w in weights]
    budgets[-1] += files - sum(budgets)
    pkgs = []  # (p, nfiles) of the layers below
    deleted = {}  # p -> indices deleted (whiteouts, opaque, package deleted)
    extra = 0  # files added into opaque folders
    layers = []

    def alive_file():
        """A file of a lower layer still in the tree, not yet touched by this layer."""
        for _ in range(100):
            p, n = pkgs[rng.randrange(len(pkgs))]
            k = rng.randrange(n)
            if k not in deleted.setdefault(p, set()) and (p, k) not in touched:
                touched.add((p, k))
                return p, k
        return None

    for index, budget in enumerate(budgets):
        ops, touched = [], set()
        if index > 0 and pkgs:
            if index % 6 == 0:
                p, n = pkgs[rng.randrange(len(pkgs))]
                first = len(DIST_INFO) if ROOTS[p % len(ROOTS)][2] else 0
                deleted.setdefault(p, set()).update(range(first, n))
                ops.append(("delete-pkg", p))
            if index in (10, 20):
                big = [(p, n) for p, n in pkgs if n > 113]
                if big:
                    p, n = big[rng.randrange(len(big))]
                    nnew = min(20, budget // 4)
                    deleted.setdefault(p, set()).update(k for k in range(13, n) if k // 50 == 2)
                    ops.append(("opaque", p, "m2", nnew))
                    extra += nnew
                    budget -= nnew
            for _ in range(budget // 50):
                pk = alive_file()
                if pk:
                    ops.append(("replace", *pk))
                    budget -= 1
            for _ in range(budget // 100):
                pk = alive_file()
                if pk:
                    deleted[pk[0]].add(pk[1])
                    ops.append(("delete", *pk))
        new = []
        while budget > 0:
            n = min(rng.randint(100, 600), budget)
            new.append((len(pkgs) + len(new), n))
            ops.append(("pkg", *new[-1]))
            budget -= n
        pkgs.extend(new)
        layers.append((index, ops))
    final = sum(n - len(deleted.get(p, ())) for p, n in pkgs) + extra
    return layers, final


def main():
    global CORPUS, BLOBS
    files, layout = int(sys.argv[1]), sys.argv[2]
    make_image.start_layout(layout)
    BLOBS = f"{layout}/blobs/sha256"
    CORPUS = make_image.text(8 << 20)
    layers, final = plan(files)
    # Largest first, so that the workers finish together.
    order = sorted(layers, key=lambda job: -len(job[1]))
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        done = dict(zip((job[0] for job in order), pool.imap(write_layer, order)))
    results = [done[i] for i in range(len(layers))]
    descs = [r[0] for r in results]
    diff_ids = [r[1] for r in results]
    make_image.write_image(layout, descs, diff_ids, {"img": len(descs)})
    count = {key: sum(r[2][key] for r in results) for key in results[0][2]}
    count["final_files"] = final
    count["layers"] = len(descs)
    count["uncompressed"] = sum(r[3] for r in results)
    count["compressed"] = sum(d["size"] for d in descs)
    print(json.dumps(count))


if __name__ == "__main__":
    main()
