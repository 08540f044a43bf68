"""Write a GGUF holding a real model's metadata (tokenizer, chat template, hyper-parameters) and no tensors.

    python make_template.py REAL.gguf OUT.gguf      (needs numpy and gguf-py, e.g. the sdist's vendor/llama.cpp/gguf-py)

randgguf.py reads it and writes random weights of any shape under that metadata.
"""

import sys

import gguf

real, out = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(real)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(out, arch)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"{out}: {arch}, {len(r.fields)} fields, no tensors")
