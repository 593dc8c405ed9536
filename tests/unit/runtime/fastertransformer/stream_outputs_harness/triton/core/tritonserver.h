// Stand-in for Triton's tritonserver.h: only the memory and data type enums the stream outputs use.
#pragma once

typedef enum { TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED, TRITONSERVER_MEMORY_GPU } TRITONSERVER_MemoryType;
typedef enum {
    TRITONSERVER_TYPE_INVALID,
    TRITONSERVER_TYPE_INT32,
    TRITONSERVER_TYPE_UINT32,
    TRITONSERVER_TYPE_FP32,
} TRITONSERVER_DataType;
