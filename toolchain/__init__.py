"""agoc's compiler library: ONNX import, partitioning, fusion, tuning, build.

No CLI, no rich, no adb here: stages are functions over plain records, and
anything that touches the outside world (a device, a compiler binary) is
passed in.
"""

__version__ = "0.1.0"
