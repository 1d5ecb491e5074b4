"""Per-image cost of the decode path alone, one thread, bytes already in memory: spdl_rs (zune-jpeg +
fast_image_resize) or torchvision (libjpeg-turbo + its uint8 resize). Run each in its own venv, one after
the other, on the same file list:

    .venv/bin/python benches/compare/decode_parity.py --impl spdl_rs --list FILES.txt
    .venv-peers/bin/python benches/compare/decode_parity.py --impl torchvision --list FILES.txt

Prints ms per image for decode and for decode + resize to SIZE x SIZE (bilinear, antialiased), per pass
(CPU time of the process, `time.process_time`).
"""

from __future__ import annotations

import argparse
import time
import warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["spdl_rs", "torchvision"], required=True)
    parser.add_argument("--list", required=True, help="a file with one JPEG path per line")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    paths = [line.strip() for line in open(args.list) if line.strip()]
    size = args.size
    if args.impl == "spdl_rs":
        import spdl_rs.io as io

        datas = [open(p, "rb").read() for p in paths]

        def decode(d):
            return io.decode_image(d)

        def decode_resize(d):
            return io.decode_image(d, size=(size, size))
    else:
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F

        warnings.filterwarnings("ignore")
        torch.set_num_threads(1)
        datas = [torch.frombuffer(bytearray(open(p, "rb").read()), dtype=torch.uint8) for p in paths]

        def decode(d):
            return decode_jpeg(d, mode=ImageReadMode.RGB)

        def decode_resize(d):
            return F.resize(decode_jpeg(d, mode=ImageReadMode.RGB), [size, size], antialias=True)

    for _ in range(args.passes):
        t = time.process_time()
        for d in datas:
            decode(d)
        a = time.process_time() - t
        t = time.process_time()
        for d in datas:
            decode_resize(d)
        b = time.process_time() - t
        print(f"{args.impl}: decode {a / len(datas) * 1e3:.3f} ms, decode + resize {size}x{size} "
              f"{b / len(datas) * 1e3:.3f} ms per image ({len(datas)} files)")


if __name__ == "__main__":
    main()
