#!/bin/bash
sort values.txt > total.txt
