module example.com/outmod

go 1.26
