package rules_test

import (
	"fmt"

	"github.com/sluicehq/sluice/rules"
)

func ExampleParse() {
	_, err := rules.Parse("api.yaml", []byte(`domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: fortnight, requests_per_unit: 10}
    burst: 0
`))
	fmt.Println(err)
	// Output:
	// api.yaml:4:24: descriptors[0].rate_limit.unit: "fortnight" is not a unit (second, minute, hour, day, week, month, year)
	// api.yaml:5:12: descriptors[0].burst: burst must be greater than 0
}

func ExampleSet_Match() {
	d, err := rules.Parse("api.yaml", []byte(`domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1000}
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 100}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, entries := range [][]rules.Entry{
		{{Key: "api_key", Value: "k1"}},
		{{Key: "api_key", Value: "k1"}, {Key: "route", Value: "/search"}},
		{{Key: "api_key", Value: "k1"}, {Key: "route", Value: "/home"}},
	} {
		if l := set.Match("api", entries); l != nil {
			fmt.Printf("%s: %d per %s, burst %d\n", l.Name, l.RequestsPerUnit, l.Unit, l.Burst)
		} else {
			fmt.Println("no limit")
		}
	}
	// Output:
	// api_key: 1000 per minute, burst 1000
	// api_key.route_/search: 100 per minute, burst 100
	// no limit
}
