#!/bin/bash
tr a-z A-Z < in.txt > out.txt
