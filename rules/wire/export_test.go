package wire

import "encoding/json"

// DecodeStd is Decode with encoding/json's decoder.
func DecodeStd(data []byte) (any, error) { return decodeWith(data, json.Unmarshal) }
