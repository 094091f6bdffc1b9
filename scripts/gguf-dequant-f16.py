#!/usr/bin/env python3
"""Writes an F16 copy of a GGUF file: every quantized or float tensor of 2 or more dimensions is
dequantized (gguf's reference dequantizers) and stored as F16, 1-D tensors as F32; the metadata is
copied (general.file_type set to 1, MOSTLY_F16). Used to make an f16 source for the quantizer
comparisons in docs/benchmarks.md when the original checkpoint is not at hand.

    python3 scripts/gguf-dequant-f16.py IN.gguf OUT.gguf     # needs the `gguf` and `numpy` packages
"""
import sys

import gguf
import numpy as np


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = 1 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(d) for d in reversed(t.shape)]  # ggml order → numpy row-major
        values = np.asarray(values, dtype=np.float32).reshape(shape)
        writer.add_tensor(t.name, values.astype(np.float16 if len(shape) >= 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
