"""What the scripts that write a GGUF model from another share (merge-lora.py,
test-model-layers.py): copying the source's keys into a writer."""
import gguf


def copy_fields(reader, writer, override=None):
    """Every key of `reader` into `writer` (the architecture is the writer's own, the GGUF.*
    header fields are written by the writer), with the values in `override` instead."""
    override = override or {}
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, override.get(field.name, field.contents()), vtype, sub_type=sub)
