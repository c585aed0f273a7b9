package limiter

import "strings"

// Slot returns the Redis Cluster hash slot of key (0–16383): CRC16-XMODEM
// of the key, or of its hash tag (the text between the first '{' and the
// next '}', when not empty), modulo 16384, as Redis computes it.
func Slot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc & 16383)
}

// crc16Table is the CRC16-XMODEM (polynomial 0x1021) lookup table.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
