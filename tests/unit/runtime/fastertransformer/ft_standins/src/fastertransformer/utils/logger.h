// A stand-in for FasterTransformer's logger.h, shared by the tests that build ftx's patch files against a fake
// CUDA runtime: its warning and info formats on stderr, debug lines dropped.
#pragma once

#include <cstdarg>
#include <cstdio>

namespace fastertransformer {

inline void fakeLog(const char* prefix, const char* format, ...)
{
    va_list args;
    va_start(args, format);
    std::fputs(prefix, stderr);
    std::vfprintf(stderr, format, args);
    std::fputs("\n", stderr);
    va_end(args);
}

}  // namespace fastertransformer

#define FT_LOG_WARNING(...) fastertransformer::fakeLog("[FT][WARNING] ", __VA_ARGS__)
#define FT_LOG_INFO(...) fastertransformer::fakeLog("[FT][INFO] ", __VA_ARGS__)
#define FT_LOG_DEBUG(...)                                                                                              \
    do {                                                                                                               \
    } while (0)
