// Parameterised tests over every kernel of the dispatch table this CPU can
// run: each test shape crossed with each kernel of the shape's dtype, named
// "<kernel>_<shape>". Shape needs a `dtype` member. Header-only.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/linear_kernels.h"
#include "gtest/gtest.h"

namespace tandem::test {

template <typename Shape>
struct KernelCase {
  Shape shape;
  const LinearKernel* kernel;
};

template <typename Shape>
std::vector<KernelCase<Shape>> WithEveryKernel(const std::vector<Shape>& shapes) {
  std::vector<KernelCase<Shape>> cases;
  for (const Shape& shape : shapes)
    for (const LinearKernel& kernel : AllLinearKernels())
      if (kernel.dtype == shape.dtype) cases.push_back({shape, &kernel});
  return cases;
}

// The test-name generator for INSTANTIATE_TEST_SUITE_P, given the shape's.
template <typename Shape, typename ShapeName>
auto KernelCaseName(ShapeName shape_name) {
  return [shape_name](const ::testing::TestParamInfo<KernelCase<Shape>>& info) {
    return absl::StrCat(info.param.kernel->name, "_", shape_name(info.param.shape));
  };
}

}  // namespace tandem::test
