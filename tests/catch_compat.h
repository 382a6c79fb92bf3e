// One include for every test: Catch2 v2 (Debian 12, <catch2/catch.hpp>) or v3 (Ubuntu 24.04).
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>  // declares ::Approx
#endif
