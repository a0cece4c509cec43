#!/usr/bin/env python3
"""Writes the synthetic image of bench/pull.sh as an OCI layout.

Usage: make-image.py LAYOUT_DIR

About 3 GB uncompressed in about 40k files over six gzip layers: many small
text-like files (compressible), large shared-library-like blobs (half random,
half repetitive), incompressible data files, and a layer that deletes files
and a folder of a lower layer (whiteouts), replaces others and adds hard
links. A second tag, "plus", is the same image with one more small layer
(for the shared-base measurement). Deterministic: the same digests each time.
"""
import gzip
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile

MTIME = 1_700_000_000
rng = random.Random(20261129)
WORDS = [rng.randbytes(rng.randint(2, 9)).hex().encode() for _ in range(4000)]


def text(n):
    """About n bytes of word salt (gzip ~3x)."""
    out = []
    size = 0
    while size < n:
        w = WORDS[rng.randrange(len(WORDS))]
        out.append(w)
        size += len(w) + 1
    return b" ".join(out)[:n]


def semi(n):
    """Half random, half a repeated pattern (gzip ~2x), like a shared library."""
    pattern = rng.randbytes(4096)
    out = bytearray()
    while len(out) < n:
        out += rng.randbytes(256 * 1024)
        out += pattern * 64
    return bytes(out[:n])


class Layer:
    def __init__(self, path):
        self.path = path
        self.raw = open(path + ".tar", "wb")
        self.tar = tarfile.open(fileobj=self.raw, mode="w", format=tarfile.PAX_FORMAT)
        self.dirs = set()

    def _info(self, name, kind, size=0, mode=0o644):
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.size = size
        ti.mode = mode
        ti.mtime = MTIME
        ti.uid = ti.gid = 0
        return ti

    def dir(self, name):
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                self.tar.addfile(self._info(d, tarfile.DIRTYPE, mode=0o755))

    def file(self, name, data, mode=0o644):
        self.dir(os.path.dirname(name))
        self.tar.addfile(self._info(name, tarfile.REGTYPE, len(data), mode), io.BytesIO(data))

    def link(self, name, target):
        self.dir(os.path.dirname(name))
        ti = self._info(name, tarfile.LNKTYPE)
        ti.linkname = target
        self.tar.addfile(ti)

    def close(self):
        self.tar.close()
        self.raw.close()


def build(workdir):
    layers = []

    l = Layer(f"{workdir}/l1")  # base system: many small files
    for i in range(25000):
        l.file(f"usr/share/doc/pkg{i // 100:03d}/file{i:05d}.txt", text(rng.randint(512, 12000)))
    for i in range(200):
        l.file(f"usr/lib/x86_64-linux-gnu/libbase{i:03d}.so", semi(rng.randint(256 << 10, 1 << 20)), 0o755)
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l2")  # big shared libraries
    for i in range(24):
        l.file(f"opt/cuda/lib64/libbig{i:02d}.so.12", semi(40 << 20), 0o755)
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l3")  # an interpreter's packages
    for i in range(10000):
        l.file(f"usr/lib/python3/site-packages/mod{i // 50:03d}/f{i:05d}.py", text(rng.randint(1000, 7000)))
    for i in range(10):
        l.file(f"usr/lib/python3/site-packages/native/ext{i}.so", semi(60 << 20), 0o755)
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l4")  # data: incompressible
    for i in range(12):
        l.file(f"data/weights{i:02d}.bin", rng.randbytes(64 << 20))
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l5")  # updates: deletes, replacements, hard links
    for i in range(0, 2000):
        l.file(f"usr/share/doc/pkg{i // 100:03d}/.wh.file{i:05d}.txt", b"")
    l.file("usr/share/doc/.wh.pkg240", b"")
    for i in range(5000, 6000):
        l.file(f"usr/share/doc/pkg{i // 100:03d}/file{i:05d}.txt", text(rng.randint(512, 12000)))
    for i in range(4):
        l.file(f"opt/app/bin/tool{i}", semi(64 << 20), 0o755)
        l.link(f"opt/app/bin/tool{i}-alias", f"opt/app/bin/tool{i}")
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l6")  # configuration
    for i in range(1000):
        l.file(f"etc/app/conf.d/{i:04d}.conf", text(rng.randint(100, 2000)))
    l.close(); layers.append(l)

    l = Layer(f"{workdir}/l7")  # the "plus" image's own layer
    for i in range(100):
        l.file(f"opt/plus/f{i:03d}", text(4000))
    l.close(); layers.append(l)
    return layers


def put(layout, data, media_type):
    digest = hashlib.sha256(data).hexdigest()
    with open(f"{layout}/blobs/sha256/{digest}", "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def start_layout(layout):
    os.makedirs(f"{layout}/blobs/sha256", exist_ok=True)
    with open(f"{layout}/oci-layout", "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')


def write_image(layout, descs, diff_ids, tags):
    """The configs, manifests and index.json: tags maps a tag to how many of
    the layers (the first ones) its image has."""
    manifests = []
    for tag, n in tags.items():
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids[:n]},
        }
        cdesc = put(layout, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": cdesc,
            "layers": descs[:n],
        }
        mdesc = put(layout, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        mdesc["annotations"] = {"org.opencontainers.image.ref.name": tag}
        manifests.append(mdesc)
    with open(f"{layout}/index.json", "w") as f:
        json.dump({"schemaVersion": 2, "manifests": manifests}, f)


def main():
    layout = sys.argv[1]
    start_layout(layout)
    layers = build(layout)
    descs, diff_ids = [], []
    # gzip -1, two at a time (both cores).
    procs = []
    for l in layers:
        h = hashlib.sha256()
        with open(l.path + ".tar", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        diff_ids.append("sha256:" + h.hexdigest())
        procs.append(subprocess.Popen(["sh", "-c", f"gzip -1 -n -c {l.path}.tar > {l.path}.tar.gz && rm {l.path}.tar"]))
        if len(procs) >= 2:
            procs.pop(0).wait()
    for p in procs:
        p.wait()
    for l in layers:
        data = open(l.path + ".tar.gz", "rb").read()
        descs.append(put(layout, data, "application/vnd.oci.image.layer.v1.tar+gzip"))
        os.remove(l.path + ".tar.gz")
    write_image(layout, descs, diff_ids, {"big": 6, "plus": 7})


if __name__ == "__main__":
    main()
