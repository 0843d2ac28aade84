package data_test

import (
	"fmt"

	"github.com/recal-project/recal/data"
)

func ExampleF1() {
	golden := []string{"Gloria Gaynor", "Gaynor"}
	fmt.Printf("%.2f\n", data.F1("It was sung by Gloria Gaynor.", golden))
	fmt.Printf("%.2f\n", data.F1("the Gaynor", golden))
	fmt.Printf("%.2f\n", data.ExactMatch("the Gaynor", golden))
	// Yes/no answers only match themselves.
	fmt.Printf("%.2f\n", data.F1("yes", []string{"no"}))
	// Output:
	// 0.50
	// 1.00
	// 1.00
	// 0.00
}

func ExampleNormalize() {
	fmt.Printf("%q\n", data.Normalize("  The Eiffel Tower, in Paris!  "))
	// Output: "eiffel tower in paris"
}

func ExampleSampler() {
	train := []data.Example{
		{ID: "nq/1", Dataset: "nq", Question: "q1?", Golden: []string{"a"}},
		{ID: "nq/2", Dataset: "nq", Question: "q2?", Golden: []string{"b"}},
		{ID: "hotpotqa/1", Dataset: "hotpotqa", Question: "q3?", Golden: []string{"c"}},
	}
	s, _ := data.NewSampler(train, 42)
	s.Next(2)
	saved := s.State() // store in the checkpoint

	resumed, _ := data.NewSampler(train, 42)
	if err := resumed.Restore(saved); err != nil {
		fmt.Println(err)
	}
	a, b := s.Next(4), resumed.Next(4)
	fmt.Println(a[0].ID == b[0].ID && a[3].ID == b[3].ID, resumed.State().Epoch)
	// Output: true 1
}
