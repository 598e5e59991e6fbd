// Package knob is the mechanism of the loader's table of settings: a Knob names a
// field of a settings struct with its flag name, default, limits and help, and sets,
// checks and prints it from a command line's flag, a trainer's hello or the struct
// itself. The table itself (shardload.Knobs) is the library's; this package knows no
// settings and imports nothing of the loader but package mem.
package knob

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/shardload/shardload/mem"
)

// A Knob is one of a settings struct's scalar settings: its name (the command line's
// --NAME flag and SHARDLOAD_NAME environment variable; with dashes as underscores,
// its label in the metrics), the struct field it sets, its default, its limits and its
// help text.
type Knob struct {
	Name  string // "read-ahead"
	Field string // the struct's field: "ReadAhead"
	Help  string
	// Default is the default the flag shows; the zero value of the field means it.
	// Auto, when set, says what the default is instead, when it is worked out.
	Default int64
	Auto    string
	Min     int64 // the least value given (counts and sizes)
	Max     int64 // the most, when not 0
	Bytes   bool  // a size: 512, 64KiB, 1GiB
	// Tuned: the tuner changes the setting while the loader runs, unless it is given.
	Tuned bool
	// Hello is the member of a trainer's hello (serve, protocol version 4) that sets
	// it, "" when a trainer may not (the server's flag is the default); with HelloNot
	// the member is the setting's negation (shuffle for --no-shuffle).
	Hello    string
	HelloNot bool
	// PerRank: each trainer's hello gives it (rank, world, seed, batching); a flag of
	// bench only.
	PerRank bool
	// Invert: a flag of the negated field (--autotune sets NoAutotune).
	Invert bool
	// ZeroIs: a value of 0 given is stored as this (--read-gap 0: none, -1).
	ZeroIs int64
	// Source: a flag of every command that reads shards (the sources' settings, which
	// a loader takes as its knobs when they are given), not of the loader's alone.
	Source bool
}

// IntValue returns the knob's value in cfg (a pointer to the settings struct) when its
// field is an integer.
func (k Knob) IntValue(cfg any) (int64, bool) {
	f := k.field(cfg)
	if !f.CanInt() {
		return 0, false
	}
	return f.Int(), true
}

// Label returns the knob's name with underscores: its label in the metrics.
func (k Knob) Label() string { return strings.ReplaceAll(k.Name, "-", "_") }

// field returns the knob's field of cfg, a pointer to the settings struct.
func (k Knob) field(cfg any) reflect.Value {
	f := reflect.ValueOf(cfg).Elem().FieldByName(k.Field)
	if !f.IsValid() {
		panic("knob: " + k.Name + ": " + reflect.TypeOf(cfg).String() + " has no field " + k.Field)
	}
	return f
}

// Set sets the knob in cfg (a pointer to the settings struct) from its command-line form ("8", "64MiB", "true"), checking
// it against the knob's least value.
func (k Knob) Set(cfg any, s string) error {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("--%s %q: want true or false", k.Name, s)
		}
		f.SetBool(b != k.Invert)
		return nil
	case reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return fmt.Errorf("--%s %q: want a number from 0 to 2^64-1", k.Name, s)
		}
		f.SetUint(n)
		return nil
	}
	var n int64
	var err error
	if k.Bytes {
		n, err = mem.ParseSize(s)
	} else {
		n, err = strconv.ParseInt(s, 10, 64)
	}
	if err != nil {
		return fmt.Errorf("--%s %q: want a %s", k.Name, s, map[bool]string{true: "size (512, 64KiB, 1GiB)", false: "whole number"}[k.Bytes])
	}
	if err = k.Check(n); err == nil {
		err = k.setInt(f, n)
	}
	if err != nil {
		return fmt.Errorf("--%s %d: %v", k.Name, n, err)
	}
	return nil
}

// Check refuses a value outside the knob's limits, saying what it wants.
func (k Knob) Check(n int64) error {
	switch {
	case k.Max > 0 && (n < k.Min || n > k.Max):
		return fmt.Errorf("want %d to %d", k.Min, k.Max)
	case n < k.Min:
		return fmt.Errorf("want at least %d", k.Min)
	}
	return nil
}

// setInt sets f to n, a value given (its ZeroIs stands for 0).
func (k Knob) setInt(f reflect.Value, n int64) error {
	if n == 0 && k.ZeroIs != 0 {
		n = k.ZeroIs
	}
	if f.OverflowInt(n) {
		return errors.New("too large")
	}
	f.SetInt(n)
	return nil
}

// SetHello sets the knob in cfg from its member in a trainer's hello: a number, or
// true or false.
func (k Knob) SetHello(cfg any, raw json.RawMessage) error {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return fmt.Errorf("%s: want true or false, not %.40s", k.Hello, raw)
		}
		f.SetBool(b != k.Invert != k.HelloNot)
		return nil
	case reflect.Uint64:
		var n uint64
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("%s: want a number from 0 to 2^64-1, not %.40s", k.Hello, raw)
		}
		f.SetUint(n)
		return nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("%s: want a whole number, not %.40s", k.Hello, raw)
	}
	err := k.Check(n)
	if err == nil {
		err = k.setInt(f, n)
	}
	if err != nil {
		return fmt.Errorf("%s %d: %v", k.Hello, n, err)
	}
	return nil
}

// Value returns the knob's value in cfg in its command-line form.
func (k Knob) Value(cfg any) string {
	f := k.field(cfg)
	switch f.Kind() {
	case reflect.Bool:
		return strconv.FormatBool(f.Bool() != k.Invert)
	case reflect.Uint64:
		return strconv.FormatUint(f.Uint(), 10)
	}
	n := f.Int()
	if n == k.ZeroIs && n != 0 {
		n = 0
	}
	if k.Bytes && n > 0 {
		return mem.FormatSize(n)
	}
	return strconv.FormatInt(n, 10)
}

// DefaultText returns the knob's default as the command line's help shows it;
// zero is the settings struct's zero value.
func (k Knob) DefaultText(zero any) string {
	switch {
	case k.Auto != "":
		return k.Auto
	case k.Bytes:
		return mem.FormatSize(k.Default)
	}
	if reflect.ValueOf(zero).FieldByName(k.Field).Kind() == reflect.Bool {
		return strconv.FormatBool(k.Default != 0)
	}
	return strconv.FormatInt(k.Default, 10)
}

// Setting returns a tuned knob's value in s, a struct of the tuned settings (Tuned
// knobs' fields have the same names there).
func (k Knob) Setting(s any) int64 {
	f := reflect.ValueOf(s).FieldByName(k.Field)
	if !k.Tuned || !f.IsValid() {
		panic("knob: " + k.Name + ": not in Settings")
	}
	return f.Int()
}

// SetDefault sets the knob's field in cfg (a pointer to the settings struct) to the
// knob's Default when the field is an integer left at 0.
func (k Knob) SetDefault(cfg any) {
	if f := k.field(cfg); k.Default != 0 && f.CanInt() && f.Int() == 0 {
		f.SetInt(k.Default)
	}
}
