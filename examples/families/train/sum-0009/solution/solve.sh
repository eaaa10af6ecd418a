#!/bin/bash
paste -sd+ input.txt | bc > output.txt
