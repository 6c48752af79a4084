package composer

import (
	"encoding/json"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The fast JSON ⇄ Value conversions give what the slow ones (encoding/json
// and protojson) give, and refuse what those refuse.
func TestFastValueConversionsMatchTheSlowOnes(t *testing.T) {
	values := []any{
		nil, true, false, "", "plain", "quote \" backslash \\ tab \t nl \n cr \r ctl \x01 \x1f <>& é 日本 \u2028",
		0.0, math.Copysign(0, -1), 1.0, -1.5, 1e-7, 1e-6, 123456789.0, 1e20, 1e21, 1.7976931348623157e308, 5e-324,
		0, 1, -42, int64(1) << 53, int64(1)<<53 + 1, math.MaxInt64, math.MinInt64, int32(-7),
		map[string]any{}, map[string]any{"b": 1, "a": []any{"x", nil, map[string]any{"z": false}}},
		[]any{}, []any{1, "two", 3.5}, map[string]string{"k": "v", "e": ""},
		map[string]any(nil), []any(nil), map[string]string(nil),
	}
	for _, v := range values {
		fast, ok := fastValue(v, 0)
		if !ok {
			t.Errorf("fastValue(%#v) refused", v)
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		slow := &structpb.Value{}
		if err := protojson.Unmarshal(b, slow); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(fast, slow) {
			t.Errorf("fastValue(%#v) = %v, want %v", v, fast, slow)
		}
		// and back to JSON
		got, ok := appendValueJSON(nil, slow, 0)
		if !ok {
			t.Errorf("appendValueJSON(%v) refused", slow)
			continue
		}
		want, err := protojson.Marshal(slow)
		if err != nil {
			t.Fatal(err)
		}
		var gotAny, wantAny any
		if err := json.Unmarshal(got, &gotAny); err != nil {
			t.Fatalf("appendValueJSON(%v) = %s: %v", slow, got, err)
		}
		_ = json.Unmarshal(want, &wantAny)
		gotJSON, _ := json.Marshal(gotAny)
		wantJSON, _ := json.Marshal(wantAny)
		if string(gotJSON) != string(wantJSON) {
			t.Errorf("appendValueJSON(%v) = %s, protojson %s", slow, got, want)
		}
		back := &structpb.Value{}
		if err := protojson.Unmarshal(got, back); err != nil || !proto.Equal(back, slow) {
			t.Errorf("appendValueJSON(%v) = %s does not read back (%v)", slow, got, err)
		}
	}
	// Numbers are written as encoding/json writes them (an integer as an integer).
	for f, want := range map[float64]string{1e6: "1000000", 1e21: "1e+21", 1e-7: "1e-7", 0.5: "0.5", -3: "-3"} {
		if got, _ := appendNumber(nil, f); string(got) != want {
			t.Errorf("appendNumber(%v) = %s, want %s", f, got, want)
		}
	}
	// What the slow paths refuse is left to them.
	for _, v := range []any{math.NaN(), math.Inf(1), "bad \xff utf8", map[string]any{"\xff": 1}, struct{ A int }{1}, float32(1)} {
		if _, ok := fastValue(v, 0); ok {
			t.Errorf("fastValue(%#v) accepted", v)
		}
	}
	for _, v := range []*structpb.Value{{}, structpb.NewNumberValue(math.NaN()), structpb.NewNumberValue(math.Inf(-1)), {Kind: &structpb.Value_StringValue{StringValue: "\xff"}}} {
		if _, ok := appendValueJSON(nil, v, 0); ok {
			t.Errorf("appendValueJSON(%v) accepted", v)
		}
	}
	// toValue still goes through encoding/json for anything else.
	type out struct {
		Name string `json:"name"`
		Skip int    `json:"-"`
	}
	v, err := toValue(out{Name: "n", Skip: 3})
	if err != nil || v.GetStructValue().GetFields()["name"].GetStringValue() != "n" || len(v.GetStructValue().GetFields()) != 1 {
		t.Errorf("toValue(struct) = %v, %v", v, err)
	}
	if _, err := toValue(map[string]any{"x": math.NaN()}); err == nil {
		t.Error("toValue accepted a NaN")
	}
}
