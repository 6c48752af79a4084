package composer

import (
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"
)

// Fast paths of the JSON ⇄ google.protobuf.Value conversions made for every
// task (its input, its output): they go straight from one form to the other
// instead of through encoding/json and protojson. Each gives the same result
// as the slow path it stands for, and hands anything it is not sure of back
// to that slow path.

// appendValueJSON appends v as compact JSON (map keys sorted, numbers as
// encoding/json and protojson write them). false: v holds something protojson
// refuses (a NaN or infinite number, an unset kind, invalid UTF-8): the
// caller falls back to protojson.
func appendValueJSON(b []byte, v *structpb.Value, depth int) ([]byte, bool) {
	if depth > 100 {
		return b, false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return append(b, "null"...), true
	case *structpb.Value_BoolValue:
		return strconv.AppendBool(b, k.BoolValue), true
	case *structpb.Value_NumberValue:
		return appendNumber(b, k.NumberValue)
	case *structpb.Value_StringValue:
		return appendString(b, k.StringValue)
	case *structpb.Value_StructValue:
		fields := k.StructValue.GetFields()
		if len(fields) == 0 {
			return append(b, "{}"...), true
		}
		keys := make([]string, 0, len(fields))
		for key := range fields {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, key := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendString(b, key); !ok {
				return b, false
			}
			b = append(b, ':')
			if b, ok = appendValueJSON(b, fields[key], depth+1); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	case *structpb.Value_ListValue:
		b = append(b, '[')
		for i, item := range k.ListValue.GetValues() {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendValueJSON(b, item, depth+1); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	}
	return b, false
}

// appendNumber writes a finite float as encoding/json does (and protojson:
// plain notation between 1e-6 and 1e21, else exponent notation).
func appendNumber(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string; false if s is not valid UTF-8.
func appendString(b []byte, s string) ([]byte, bool) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return b, false
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}

// fastValue converts the plain JSON-shaped Go values a handler most often
// returns (nil, bool, string, finite numbers, map[string]any, []any and
// map[string]string of those) straight to a Value, which is what
// json.Marshal followed by protojson.Unmarshal makes of them. false: v holds
// anything else (a struct, a json.Marshaler, a NaN, invalid UTF-8 ...), left
// to the slow path.
func fastValue(v any, depth int) (*structpb.Value, bool) {
	if depth > 64 {
		return nil, false
	}
	switch x := v.(type) {
	case nil:
		return structpb.NewNullValue(), true
	case bool:
		return structpb.NewBoolValue(x), true
	case string:
		if !utf8.ValidString(x) {
			return nil, false
		}
		return structpb.NewStringValue(x), true
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, false
		}
		return structpb.NewNumberValue(x), true
	case int:
		return intValue(int64(x))
	case int32:
		return intValue(int64(x))
	case int64:
		return intValue(x)
	case map[string]any:
		if x == nil {
			return structpb.NewNullValue(), true
		}
		fields := make(map[string]*structpb.Value, len(x))
		for key, item := range x {
			if !utf8.ValidString(key) {
				return nil, false
			}
			value, ok := fastValue(item, depth+1)
			if !ok {
				return nil, false
			}
			fields[key] = value
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), true
	case map[string]string:
		if x == nil {
			return structpb.NewNullValue(), true
		}
		fields := make(map[string]*structpb.Value, len(x))
		for key, item := range x {
			if !utf8.ValidString(key) || !utf8.ValidString(item) {
				return nil, false
			}
			fields[key] = structpb.NewStringValue(item)
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), true
	case []any:
		if x == nil {
			return structpb.NewNullValue(), true
		}
		values := make([]*structpb.Value, len(x))
		for i, item := range x {
			value, ok := fastValue(item, depth+1)
			if !ok {
				return nil, false
			}
			values[i] = value
		}
		return structpb.NewListValue(&structpb.ListValue{Values: values}), true
	}
	return nil, false
}

// intValue: an integer becomes the float64 protojson parses its decimal
// form into (the nearest one).
func intValue(n int64) (*structpb.Value, bool) {
	return structpb.NewNumberValue(float64(n)), true
}
