//go:build !amd64

package mem

const haveStream = false

func stream(dst, src []byte) { copy(dst, src) }
