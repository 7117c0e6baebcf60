import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Small segments make every size up to a few thousand elements cross many
# pipeline segments, so the segment bookkeeping is exercised cheaply.
SMALL_CHUNKS = {"RCOLL_CHUNK_BYTES": "256", "RCOLL_MIN_CHUNK_BYTES": "64", "RCOLL_SHM_COLL_SLOT_BYTES": "4K",
                "RCOLL_CUDA_IPC_SLOT_BYTES": "4K"}
