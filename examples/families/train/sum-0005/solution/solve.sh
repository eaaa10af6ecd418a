#!/bin/bash
paste -sd+ input.txt | bc > result.txt
