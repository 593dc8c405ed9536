// A stand-in for FasterTransformer's logger.h: its warning and info formats, on stderr.
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
