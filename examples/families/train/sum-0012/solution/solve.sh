#!/bin/bash
paste -sd+ data.txt | bc > answer.txt
