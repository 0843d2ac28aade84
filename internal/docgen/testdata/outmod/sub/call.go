package sub

// Call is nested under Line.calls.
type Call struct {
	Model  string `json:"model"` // the model | its name
	Nested struct {
		A bool `json:"a"`
	} `json:"nested"`
}
