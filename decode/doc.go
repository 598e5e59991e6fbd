// Package decode will own the decoding of sample fields (raw bytes, .npy arrays, integer
// class labels, text, JSON, per-member .gz) and their collation into batch slabs:
// fixed-shape fields as contiguous columns, variable-length fields as offsets plus bytes.
// It does not allocate pinned memory itself.
package decode
