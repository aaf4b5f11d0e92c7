// Stand-in for DeepJIT's exception.hpp (it needs elfutils): errors throw.
#pragma once
#include <format>
#include <stdexcept>
#define DJ_PANIC(...) throw std::runtime_error(std::format(__VA_ARGS__))
#define DJ_HOST_ASSERT(cond, ...) do { if (!(cond)) throw std::runtime_error("assertion failed: " #cond); } while (0)
#define DJ_STATIC_ASSERT(cond, ...) static_assert(cond)
