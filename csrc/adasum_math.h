// Adasum's arithmetic on one slice of a buffer (adasum.h runs the collective):
// the dot product and squared norms of two slices, the coefficients they give,
// and the combination of the slices.
//
// Everything is computed in double whatever the element type (float16,
// bfloat16, float32, float64), as Horovod accumulates: the dot products and
// norms of a few million float32 elements would lose most of their digits in
// float, and a coefficient is only as good as they are.
#pragma once

#include <cstddef>

#include "dtype.h"

namespace rcoll {

// The three numbers Adasum needs of two vectors a and b.
struct DotAndNorms {
  double dot = 0;   // a . b
  double a_sq = 0;  // |a|^2
  double b_sq = 0;  // |b|^2
};

// Of `count` elements of `dtype` at `a` and at `b` (both in host memory).
DotAndNorms dotAndNorms(const char* a, const char* b, size_t count, DataType dtype);

// The coefficient of a vector v in adasum(v, w): 1 - (v . w) / (2 |v|^2).
// Where |v|^2 is below sqrt(DBL_MIN) (a zero vector, or one so small that the
// division would overflow) it is 1, as in Horovod: v then enters as in a plain
// sum (and a zero side changes nothing). A NaN norm takes that branch too.
double adasumCoefficient(double dot, double norm_sq);

// a[i] = a_coeff * a[i] + b_coeff * b[i] for `count` elements of `dtype`,
// computed in double and rounded once to the element type.
void scaledAdd(char* a, double a_coeff, const char* b, double b_coeff, size_t count, DataType dtype);

// Whether the two functions above take `dtype` (the floating types but float8).
bool adasumTakes(DataType dtype);

}  // namespace rcoll
